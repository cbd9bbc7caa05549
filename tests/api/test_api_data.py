"""Issue 21 on the API: ``POST /studies`` takes the user's data as per-sample token lengths inline (the server reads
no dataset path of a caller's choosing), and the job's lengths are the longest sample's, as `tuner search --dataset`
holds them. Bounded: at most MAX_INLINE_SAMPLES samples of at most MAX_TOKENS tokens, else one 422 line naming the
field. Real SQLite storage through the FastAPI app."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from tuner.job.inline_data import MAX_INLINE_SAMPLES, MAX_TOKENS
from tuner.job.length_summary import LengthSummary
from tuner.settings import Settings
from tuner.storage import Store

TOKEN = "s3cret-token-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def quick(sqlite_url: str) -> tuple[TestClient, str]:
    app = create_app(Settings(storage=sqlite_url, api_token=TOKEN))
    return TestClient(app, raise_server_exceptions=False), sqlite_url


def _post(client: TestClient, body: dict) -> tuple[int, str]:
    r = client.post("/studies", json={"model": "builtin:tiny-t5", **body}, headers=AUTH)
    detail = r.json().get("detail", "") if r.status_code >= 400 else ""
    assert isinstance(detail, str) and "\n" not in detail, r.text
    return r.status_code, detail


def test_posted_lengths_set_the_jobs_lengths_to_the_longest_sample(quick) -> None:
    client, url = quick
    pairs = [[12, 3], [30, 7], [411, 9], [25, 40]]
    assert _post(client, {"name": "seq2seq", "sample_lengths": pairs})[0] == 201
    job = Store(url).require_study("seq2seq")["job"]
    assert (job["max_length"], job["max_target_length"]) == (411, 40)  # untruncated: inputs and targets separately
    # the lengths land in the study's stored data summary, as a dataset's do (exact: four distinct pairs)
    data = LengthSummary.from_json(Store(url).require_study("seq2seq")["data"])
    assert data.rounding.exact and data.samples == 4 and data.rows == ((12, 3, 1), (25, 40, 1), (30, 7, 1), (411, 9, 1))
    assert data.origin.source == "sample_lengths posted inline"
    status, _ = _post(client, {"name": "capped", "sample_lengths": pairs, "max_length": 64})
    assert status == 201 and Store(url).require_study("capped")["job"]["max_length"] == 64  # a flag truncates


@pytest.mark.parametrize(
    "body, words",
    [
        ({"dataset": "/etc"}, "dataset"),  # no path: the server reads none of a caller's choosing
        ({"sample_lengths": [[1, 2]] * (MAX_INLINE_SAMPLES + 1)}, "sample_lengths"),
        ({"sample_lengths": [[MAX_TOKENS + 1, 2]]}, "sample_lengths"),
        ({"sample_lengths": [-3, 4]}, "sample_lengths"),
        ({"sample_lengths": [[1, 2, 3]]}, "sample_lengths"),
        ({"sample_lengths": []}, "sample_lengths"),
        ({"sample_lengths": [[0, 0]]}, "sample_lengths"),
        ({"sample_lengths": [True, 2]}, "sample_lengths"),
    ],
    ids=["path", "too-many", "too-long", "negative", "triple", "empty", "zero", "bool"],
)
def test_bad_posted_data_is_one_4xx_line_naming_the_field_and_stores_nothing(quick, body, words) -> None:
    client, url = quick
    status, detail = _post(client, {"name": "bad", **body})
    assert status in (400, 422), detail
    assert words in detail, detail
    assert Store(url).study_definition("bad") is None
