"""Issue 24 §5: 20 concurrent POST /studies of one name against a real `tuner serve` (uvicorn, its thread pool) on
SQLite and PostgreSQL: exactly one 201, the others 409, and what is stored is the definition the 201 answered
(it was 13 x 201 on SQLite and 12 on PostgreSQL, most for a world size that was not stored)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import httpx

from tuner.storage import Store

TOKEN = "race-token"
N = 20


def test_twenty_concurrent_posts_of_one_name_create_it_once(storage_url: str, tuner_server: Callable[..., str]) -> None:
    base = tuner_server(storage_url, env={"TUNER_API_TOKEN": TOKEN})
    start = threading.Barrier(N)
    answers: dict[int, httpx.Response] = {}

    def post(world_size: int) -> None:
        with httpx.Client(base_url=base, timeout=120) as http:
            start.wait()
            answers[world_size] = http.post(
                "/studies",
                json={"name": "raced", "world_size": world_size, "global_batch": 64 * world_size},
                headers={"Authorization": f"Bearer {TOKEN}"},
            )

    threads = [threading.Thread(target=post, args=(w,)) for w in range(1, N + 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    statuses = sorted(r.status_code for r in answers.values())
    assert statuses == [201] + [409] * (N - 1), [(w, r.status_code, r.text[:200]) for w, r in answers.items()]
    (winner,) = [w for w, r in answers.items() if r.status_code == 201]
    stored = Store(storage_url).study_definition("raced")
    assert stored is not None and stored["world_size"] == winner
    assert all("already exists" in r.json()["detail"] for r in answers.values() if r.status_code == 409)
