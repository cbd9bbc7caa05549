"""Store writes several workers race on: creating one study (one INSERT wins, the others get its definition and know
they did not create it). Real SQLite and PostgreSQL, real threads."""

from __future__ import annotations

import threading

from tuner.storage import Store


def test_two_workers_creating_one_study_agree_on_one_definition(storage_url: str) -> None:
    Store(storage_url)  # the schema first: the race here is on the study, not on first use
    barrier = threading.Barrier(4)
    results: list[tuple[dict, bool]] = []
    lock = threading.Lock()

    def create(i: int) -> None:
        store = Store(storage_url)
        barrier.wait()
        got = store.create_study("raced", {"headroom": 0.5 + i / 10})
        with lock:
            results.append(got)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(created for _, created in results) == 1
    stored = Store(storage_url).study_definition("raced")
    assert all(definition == stored for definition, _ in results)
