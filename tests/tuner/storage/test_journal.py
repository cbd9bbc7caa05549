"""The local journal of unstored probe rows (tuner.storage.journal), every branch, on real files in milliseconds: where
it lives, add / done / pending, a torn or foreign line, a journal that cannot be written, and finding the journals of
one study by worker."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from tuner.storage.journal import Entry, Journal, journal_dir, journals, read_entries, safe_part, write_entries

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


def test_a_journal_that_cannot_be_written_raises_oserror_for_the_driver_to_store_directly(tmp_path: Path) -> None:
    """What a read-only or full folder does: add raises OSError (tuner.session.driver then stores the row directly and
    says so). Here the folder's path is a file, and then the journal file's path a folder (the tests run as root,
    which a read-only mode does not stop)."""
    blocked = tmp_path / "folder"
    blocked.write_text("a file where the journal folder should be")
    with pytest.raises(OSError):
        Journal(blocked, "s", "h:1").add(Entry("u", ROW))
    journal = Journal(tmp_path / "ok", "s", "h:1")
    journal.path.mkdir(parents=True)
    with pytest.raises(OSError):
        journal.add(Entry("u", ROW))
    with pytest.raises(OSError):
        write_entries(blocked / "j.jsonl", [Entry("u", ROW)])


def test_journals_lists_the_files_of_one_study_with_their_worker(tmp_path: Path) -> None:
    assert list(journals(tmp_path / "none", "s")) == []  # no folder: nothing
    for study, worker in (("s", "host-a:11"), ("s", "host-b:22"), ("s2", "host-a:33"), ("s", "host-c:x")):
        Journal(tmp_path, study, worker).add(Entry(f"{study}-{worker}", ROW))
    (tmp_path / "unrelated.txt").write_text("not a journal")
    found = sorted((host, pid) for _, host, pid in journals(tmp_path, "s"))
    assert found == [("host-a", 11), ("host-b", 22), ("host-c", None)]  # a pid that is not a number: None
    paths = [path for path, _, _ in journals(tmp_path, "s2")]
    assert [read_entries(p)[0].uid for p in paths] == ["s2-host-a:33"]
