"""Issue 33 §11: a search with data whose budget is under the estimate's 10 minutes still keeps a trace of the
baseline's shapes with the study, so `tuner trials`, `best --changes` and the live stream give the baseline's crash
line whatever the budget (a real trace of a saved tiny T5; the study's data and trace stored as the search stores
them, the crash line read back from the storage alone)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.seq2seq_data import long_tail_lengths, save_tiny_t5, write_jsonl
from tuner.session.crash_line import keep_trace, study_crash
from tuner.session.memory import baseline_trace
from tuner.session.options import CLI, SearchOptions, prepare_request
from tuner.storage.store import Store

pytestmark = pytest.mark.slow


def test_a_short_search_with_data_keeps_the_baselines_trace_for_its_crash_line(tmp_path: Path) -> None:
    model = save_tiny_t5(tmp_path / "t5")
    data = write_jsonl(tmp_path / "data.jsonl", long_tail_lengths(200))
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"per_device_train_batch_size": 4, "gradient_accumulation_steps": 1}))
    url = f"sqlite:///{tmp_path}/t.db"
    options = dict(
        budget="150s",
        study="s",
        model=str(model),
        dataset=str(data),
        input_column="source",
        target_column="target",
        baseline=str(args),
        device_memory="64MiB",
    )
    request, _ = prepare_request(SearchOptions(**options), url, CLI, tmp_path / "cache")  # type: ignore[arg-type]
    assert request.baseline is not None and request.data is not None
    assert baseline_trace(request, estimate=False) is None  # --no-estimate: nothing traced
    trace = baseline_trace(request, estimate=None)  # the default under 10 minutes
    assert trace is not None
    micro = request.baseline.micro_batch_size
    assert {p.micro_batch_size for p in trace.points} == {micro}
    assert {p.gradient_checkpointing for p in trace.points} == {request.baseline.gradient_checkpointing}

    store = Store(url)
    store.create_study("s", request.definition())
    keep_trace(store, "s", trace)
    crash = study_crash(store.require_definition("s"), store.probes("s"))
    assert crash is not None
    line = crash.line(request.baseline.model_dump(), "your config")
    assert line.startswith("your config on your data: ") and "no crash estimate" not in line, line
    assert "the estimate traced inputs of " in line, line
