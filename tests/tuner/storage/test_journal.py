"""The local journal of unstored probe rows (tuner.storage.journal), every branch, on real files in milliseconds: where
it lives, add / done / pending, a torn or foreign line, a journal that cannot be written, and finding the journals of
one study by worker."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from tuner.storage.journal import (
    Entry,
    Journal,
    journal_dir,
    journal_places,
    journals,
    read_entries,
    read_stop,
    safe_part,
    write_entries,
)

ROW = {"study_name": "s", "trial_number": 3, "status": "ok", "samples_per_s": 12.5, "knobs": {"micro_batch_size": 4}}


def test_the_journal_lives_beside_a_sqlite_file_and_under_the_cache_for_a_server(tmp_path: Path) -> None:
    db = tmp_path / "dir" / "tuner.db"
    assert journal_dir(f"sqlite:///{db}", tmp_path / "cache") == tmp_path / "dir" / "tuner.db.journal.d"
    memory = journal_dir("sqlite:///:memory:", tmp_path / "cache")
    assert memory.parent == tmp_path / "cache" / "journal"
    pg = journal_dir("postgresql+psycopg://tuner:secret@db:5432/tuner", tmp_path / "cache")
    other_password = journal_dir("postgresql+psycopg://tuner:other@db:5432/tuner", tmp_path / "cache")
    other_db = journal_dir("postgresql+psycopg://tuner:secret@db:5432/other", tmp_path / "cache")
    assert pg == other_password  # the password is no part of where: a rotated password finds the same journal
    assert pg != other_db and pg.parent == tmp_path / "cache" / "journal"
    assert "secret" not in str(pg)
    beside, cached = journal_places(f"sqlite:///{db}", tmp_path / "cache")  # a SQLite file's second place: the cache
    assert beside == tmp_path / "dir" / "tuner.db.journal.d" and cached.parent == tmp_path / "cache" / "journal"
    assert journal_places("postgresql+psycopg://tuner:secret@db:5432/tuner", tmp_path / "cache") == [pg]


def test_file_names_are_safe_and_one_per_study_and_worker(tmp_path: Path) -> None:
    assert safe_part("a/b c:d") == "a_b_c_d" and len(safe_part("x" * 500)) == 100
    a = Journal(tmp_path, "team/a", "gpu-host-1:4242")
    assert a.path.parent == tmp_path and a.path.name.endswith(".gpu-host-1.4242.jsonl")
    assert Journal(tmp_path, "team_a", "gpu-host-1:4242").path != a.path  # same safe name, another study
    assert Journal(tmp_path, "team/a", "gpu-host-1:4243").path != a.path  # another worker
    bare = Journal(tmp_path, "s", "4242")  # no host in the worker id: this host's name
    assert f".{safe_part(os.uname().nodename)}.4242.jsonl" in bare.path.name


def test_add_is_durable_at_once_and_done_drops_one_entry_then_the_file(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "new-folder", "s", "h:1")
    assert journal.pending() == []  # nothing yet, no file, no folder
    first = Entry("u1", ROW)
    second = Entry("u2", {**ROW, "samples_per_s": math.inf})  # a non-finite number survives the JSON line
    journal.add(first)
    journal.add(second)
    assert read_entries(journal.path) == [first, second]  # a fresh read of the file: it is on disk
    journal.done("u1")
    assert journal.pending() == [second]
    journal.done("no-such-uid")
    assert journal.pending() == [second]
    journal.done("u2")
    assert not journal.path.exists()  # empty: removed
    assert list(journal.path.parent.iterdir()) == []  # and no temporary file left behind


def test_a_torn_last_line_and_foreign_lines_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    good = Entry("u1", ROW)
    lines = [
        good.line(),
        '{"uid": "u2"}\n',  # no record
        '["a", "list"]\n',  # not an object
        '{"uid": "u3", "record": 7}\n',  # a record that is no mapping
        "\n",
        Entry("u4", ROW).line()[:25],  # killed mid-write, before its fsync returned
    ]
    path.write_text("".join(lines))
    assert read_entries(path) == [good]
    assert read_entries(tmp_path / "missing.jsonl") == []


def test_write_entries_replaces_the_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    write_entries(path, [Entry("a", ROW), Entry("b", ROW)])
    write_entries(path, [Entry("b", ROW)])
    assert read_entries(path) == [Entry("b", ROW)]
    write_entries(path, [])
    assert not path.exists()
    write_entries(path, [])  # nothing to remove: no error


def test_a_place_that_cannot_be_written_passes_the_entry_to_the_next_then_to_memory(tmp_path: Path) -> None:
    """What a read-only or full folder does (here the folder's path is a file: the tests run as root, which a read-only
    mode does not stop): the entry goes to the next place; with no place left it is held in memory, written at the
    next add once a place takes writes again, and ``kept`` says where each is, never "kept" for one in memory."""
    blocked = tmp_path / "beside-the-db"
    blocked.write_text("a file where the journal folder should be")
    cache = tmp_path / "cache"
    journal = Journal(blocked, "s", "h:1", fallbacks=[cache])
    assert journal.add(Entry("u1", ROW)) == journal.paths[1] and journal.paths[1].parent == cache
    assert [e.uid for e in read_entries(journal.paths[1])] == ["u1"] and blocked in {p.parent for p in journal.failures}
    assert journal.kept(tries=1) == f"1 finished probe(s) not stored are kept in {journal.paths[1]}"
    journal.done("u1")
    assert not journal.paths[1].exists() and journal.kept(tries=1) == "every finished probe is stored"

    cache.rename(tmp_path / "cache-moved")
    cache.write_text("now the cache folder is blocked too")
    assert journal.add(Entry("u2", ROW)) is None  # no place: held in memory
    assert [e.uid for e in journal.pending()] == ["u2"]
    line = journal.kept(tries=2, pause_s=0.0)
    assert "1 finished probe(s) could not be written anywhere" in line and "kept in" not in line, line
    assert str(blocked) in line and "are lost" in line

    cache.unlink()  # the cache takes writes again: the next add writes both
    assert journal.add(Entry("u3", ROW)) == journal.paths[1]
    assert [e.uid for e in read_entries(journal.paths[1])] == ["u2", "u3"]
    with pytest.raises(OSError):
        write_entries(blocked / "j.jsonl", [Entry("u", ROW)])


def test_a_stop_line_is_no_entry_and_is_read_back_for_the_next_run(tmp_path: Path) -> None:
    """``note_stop`` leaves why the worker stopped (tuner.session.recovery names it for the trials it fails); entries
    read past it, and the file goes with its last entry."""
    journal = Journal(tmp_path / "j", "s", "h:1")
    journal.add(Entry("u1", ROW))
    journal.note_stop("storage refused a write: database or disk is full")
    assert [e.uid for e in read_entries(journal.path)] == ["u1"]  # the stop line is no entry
    assert read_stop(journal.path) == "storage refused a write: database or disk is full"
    assert read_stop(tmp_path / "none.jsonl") is None
    journal.done("u1")
    assert read_entries(journal.path) == [] and sorted(p.name for p in journal.path.parent.iterdir()) == []


def test_journals_lists_the_files_of_one_study_with_their_worker(tmp_path: Path) -> None:
    assert list(journals(tmp_path / "none", "s")) == []  # no folder: nothing
    for study, worker in (("s", "host-a:11"), ("s", "host-b:22"), ("s2", "host-a:33"), ("s", "host-c:x")):
        Journal(tmp_path, study, worker).add(Entry(f"{study}-{worker}", ROW))
    (tmp_path / "unrelated.txt").write_text("not a journal")
    found = sorted((host, pid) for _, host, pid in journals(tmp_path, "s"))
    assert found == [("host-a", 11), ("host-b", 22), ("host-c", None)]  # a pid that is not a number: None
    paths = [path for path, _, _ in journals(tmp_path, "s2")]
    assert [read_entries(p)[0].uid for p in paths] == ["s2-host-a:33"]
