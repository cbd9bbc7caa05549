"""Where a probe's CUDA memory snapshots are kept (tuner.probing.snapshots): beside the study's SQLite file, moved
out of the probe's work folder with the stored path rewritten, at most MAX_KEPT of them (pure paths; real files)."""

from __future__ import annotations

from pathlib import Path

from trials.contract import ProbeResult, RankMemory
from tuner.probing.snapshots import SUFFIX, evicted, keep, kept_name, snapshot_dir
from tuner.records.measurement import Measurement


def test_the_folder_is_beside_a_sqlite_file_else_in_the_cache(tmp_path: Path) -> None:
    assert snapshot_dir(f"sqlite:///{tmp_path}/t.db", Path("/c")) == tmp_path / "t.db.oom-snapshots"
    assert snapshot_dir("postgresql+psycopg://u@h/db", Path("/c")) == Path("/c/oom-snapshots")
    assert snapshot_dir("sqlite:///:memory:", Path("/c")) == Path("/c/oom-snapshots")


def test_names_are_unique_and_the_oldest_go_first() -> None:
    first = kept_name(0.0, 1, [])
    assert first == "19700101T000000-rank1" + SUFFIX
    assert kept_name(0.0, 1, [first]) == "19700101T000000-rank1-2" + SUFFIX
    assert evicted([("b", 2.0), ("a", 1.0), ("c", 3.0)], limit=2) == ["a"]
    assert evicted([("a", 1.0)], limit=2) == []


def test_a_snapshot_is_moved_out_of_the_work_folder_and_its_path_stored(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    written = work / "result.snapshot.pickle"
    written.write_bytes(b"snapshot")
    result = ProbeResult(
        status="oom",
        ranks=[RankMemory(rank=0, snapshot=str(written)), RankMemory(rank=1, snapshot=str(work / "gone.pickle"))],
    )
    into = tmp_path / "t.db.oom-snapshots"
    kept = keep(result, into, limit=1)
    assert not written.exists()
    path = Path(kept.ranks[0].snapshot or "")
    assert path.parent == into.resolve() and path.read_bytes() == b"snapshot"
    assert kept.ranks[1].snapshot is None  # no path to a file that is not there
    stored = Measurement.from_json(kept.model_dump(mode="json"))
    assert stored.ranks[0].snapshot == str(path)
    again = keep(result.model_copy(update={"ranks": [RankMemory(rank=0, snapshot=str(_write(work)))]}), into, 1)
    assert len(list(into.iterdir())) == 1 and Path(again.ranks[0].snapshot or "").exists()  # bounded


def _write(work: Path) -> Path:
    p = work / "second.snapshot.pickle"
    p.write_bytes(b"second")
    return p


def test_a_stored_failed_allocation_reads_back_typed_and_a_broken_one_as_none() -> None:
    failed = {"nbytes": 800_000_000, "live": 37_175_568, "op": "empty.memory_format", "shape": [200_000_000]}
    stored = {"ranks": [{"rank": 0, "failed_allocation": {**failed, "later_field": 1}}, {"rank": 1}]}
    m = Measurement.from_json(stored)
    assert m.ranks[0].failed_allocation is not None and m.ranks[0].failed_allocation.shape == [200_000_000]
    assert m.ranks[1].failed_allocation is None
    broken = Measurement.from_json({"ranks": [{"rank": 0, "failed_allocation": {"nbytes": -1}}]})
    assert broken.ranks[0].failed_allocation is None
