"""The GPU check's driver in its parts (issue 41), on CPU in seconds: the plan that fits 8.5 minutes by construction
and the clock that gives each step what is left; the time boxes (SIGINT, then SIGKILL of the whole group, inside the
box) and the background traces at the lowest priority; the evidence under $OUT (a consistent copy of a database a
killed writer left with its hot journal, snapshots gzipped under their cap, eight files at most); the counts that mean
what they say (a refused probe is not a launched one, the estimate column from the first probe with measured ranks);
the pinned variant kept. The whole driver runs in tests/benchmarks/test_gpu_check_dry_run.py."""

from __future__ import annotations

import gzip
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.gpu import commands, plan
from benchmarks.gpu import evidence as ev
from benchmarks.gpu.boxed import Background, run_boxed
from benchmarks.gpu.facts import first_oom, launched
from benchmarks.gpu.pinned_step import Tried, fastest, setup_probe
from benchmarks.gpu.probe_table import checks, estimate_source
from tests.helpers.sample_storage import SampleStudy
from trials.contract import FailedAllocation, Knobs, ProbeConfig, ProbeResult, RankMemory

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20


def test_the_gpu_plan_adds_up_to_at_most_eight_and_a_half_minutes() -> None:
    config = plan.from_env({})
    assert config.deadline_s == 510 and config.total_s <= 510
    assert [s.name for s in config.steps] == [
        "kit", "env", "ops", "pinned", "search", "crash", "trainer", "tables", "evidence"
    ]  # fmt: skip
    lines = plan.plan_lines(config)
    assert lines[0] == "plan (GPU): deadline 510 s"
    assert "  search      150 s  the search -> gpu-check.db (budget 120 s)" in lines
    assert f"  total       {config.total_s:.0f} s  within the deadline (510 s)" in lines
    assert "CPU traces" in lines[-1] and "never waited for past the deadline" in lines[-1]
    dry = plan.from_env({"DRY_RUN": "1"})
    assert dry.total_s <= dry.deadline_s and dry.job.model == "builtin:tiny-t5"
    longer = plan.from_env({"GPU_CHECK_BUDGET": "3m"})  # the budget sets the search's box: it says it is over
    assert longer.step("search").box_s == 210 and "OVER" in plan.plan_lines(longer)[-2]


def test_each_step_gets_what_is_left_of_the_deadline() -> None:
    search = plan.from_env({}).step("search")
    assert plan.box_for(search, left_s=500, reserve_s=20) == 150  # its box
    assert plan.box_for(search, left_s=120, reserve_s=20) == 100  # what is left, less what the tables need
    assert plan.box_for(search, left_s=70, reserve_s=20) == 0  # less than a search is worth: skipped
    assert plan.search_budget(100) == 70
    forced = frozenset({"search-timeout", "trainer-kill"})
    assert plan.box_for(search, 500, 20, forced) == plan.FORCED_SEARCH_BOX_S
    trainer = plan.from_env({}).step("trainer")
    assert plan.box_for(trainer, 500, 20, forced) == plan.FORCED_TRAINER_BOX_S
    assert plan.reserve_after(plan.GPU_STEPS, "search") == 20  # tables + evidence


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"GPU_CHECK_FORCE": "gpu-melt"}, "GPU_CHECK_FORCE names gpu-melt; it takes ops-fail, search-timeout"),
        ({"GPU_CHECK_DEADLINE": "soon"}, "could not convert string to float"),
        ({"GPU_CHECK_DEADLINE": "-5"}, "'-5' is not a positive duration"),
    ],
)
def test_a_setting_the_check_cannot_use_is_one_line_and_exit_2(env: dict[str, str], said: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu.check"],
        env={**os.environ, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("error: ") and said in done.stderr


def test_a_command_is_stopped_inside_its_box_with_its_whole_group(tmp_path: Path) -> None:
    """SIGINT at the box less the grace; one that ignores it, and the child it left, SIGKILLed at the box."""
    pid_file = tmp_path / "child.pid"
    script = f"trap '' INT; sleep 60 & echo $! > {pid_file}; wait"
    start = time.monotonic()
    ran = run_boxed(["sh", "-c", script], 2.0, os.environ, tmp_path / "stubborn.out")
    assert ran.timed_out and ran.rc is None and time.monotonic() - start < 3.5
    child = int(pid_file.read_text())
    time.sleep(0.2)
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]
    quick = run_boxed(["sh", "-c", "echo said; echo why >&2; exit 3"], 10, os.environ, tmp_path / "quick.out")
    assert quick.rc == 3 and quick.out() == "said\n" and quick.err() == "why\n" and not quick.timed_out
    missing = run_boxed(["/nonexistent/tool"], 10, os.environ, tmp_path / "missing.out")
    assert missing.rc == 127 and "could not start /nonexistent/tool" in missing.err()


def test_a_background_trace_runs_at_the_lowest_priority_and_stops(tmp_path: Path) -> None:
    job = Background("trace", ["sleep", "60"], os.environ, tmp_path / "trace.out")
    assert job.proc is not None
    assert os.getpriority(os.PRIO_PROCESS, job.proc.pid) == 19
    assert not job.wait(time.monotonic() + 0.5)
    job.stop()
    assert job.done() and job.stopped and job.proc.poll() == -signal.SIGINT
    done = Background("quick", ["true"], os.environ, tmp_path / "quick.out")
    assert done.wait(time.monotonic() + 10) and done.rc == 0


def test_the_database_a_killed_search_left_is_copied_whole(tmp_path: Path) -> None:
    """A writer killed in the middle of a transaction leaves a hot journal: the copy is the last committed state."""
    db = tmp_path / "gpu-check.db"
    with sqlite3.connect(db) as conn:
        conn.execute("create table probes (n integer)")
        conn.executemany("insert into probes values (?)", [(i,) for i in range(3)])
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys, time\n"
            f"c = sqlite3.connect({str(db)!r}, isolation_level=None)\n"
            "c.execute('begin exclusive'); c.execute('delete from probes')\n"
            "c.executemany('insert into probes values (?)', [(9,)] * 5000)\n"
            "print('mid', flush=True); time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert writer.stdout is not None and writer.stdout.readline() == "mid\n"
    writer.kill()
    writer.wait()
    out = ev.Evidence(tmp_path / "out")
    said = out.database(db)
    assert said.startswith("copied (")
    with sqlite3.connect(out.path(ev.DB)) as conn:
        assert conn.execute("select count(*), max(n) from probes").fetchone() == (3, 2)
    assert out.database(tmp_path / "none.db") == "no database yet"


def test_snapshots_come_back_gzipped_under_their_cap_and_eight_files_at_most(tmp_path: Path) -> None:
    out = ev.Evidence(tmp_path / "out")
    snap = tmp_path / "s.snapshot.pickle"
    snap.write_bytes(b"frames " * 200_000)
    said = out.snapshot(str(snap), ev.OOM_SNAPSHOT)
    assert said.startswith(f"{ev.OOM_SNAPSHOT} (1.3 MiB, ")
    assert gzip.decompress(out.path(ev.OOM_SNAPSHOT).read_bytes()) == snap.read_bytes()
    noise = tmp_path / "noise.pickle"
    noise.write_bytes(os.urandom(2 * MiB))  # does not compress
    assert out.snapshot(str(noise), ev.CRASH_SNAPSHOT, cap=MiB).startswith("not copied: 2.0 MiB gzipped, over its 1")
    assert not out.path(ev.CRASH_SNAPSHOT).exists()
    assert out.snapshot(None, ev.CRASH_SNAPSHOT) == "none made"
    assert out.snapshot(str(tmp_path / "gone"), ev.CRASH_SNAPSHOT).endswith("is gone")
    assert len(ev.FILES) <= ev.MAX_FILES == 8
    for name in ev.FILES:
        if not out.path(name).exists():
            out.write(name, "x")
    assert out.check() == []
    (out.out / "stray.txt").write_text("x")
    assert out.check() == ["$OUT holds 9 files (stray.txt not the check's)"]
    with pytest.raises(ValueError, match="not one of the check's 8 files"):
        out.path("stray.txt")
    text = "head\n" + "x" * 5000 + "\ntail"
    cut = ev.capped(text, 1000)
    assert len(cut.encode()) <= 1000 and cut.startswith("head") and cut.endswith("tail") and "bytes cut here" in cut


def test_the_fastest_pinned_setup_is_kept_only_past_the_noise() -> None:
    d, r, e = "deepspeed", "register:16", "exact"
    assert fastest([Tried(d, "ok", 14.2, {}), Tried(r, "ok", 3.1, {}), Tried(e, "ok", 4.0, {})])[0] == r
    assert fastest([Tried(d, "ok", 10.0, {}), Tried(r, "ok", 9.7, {})])[0] == d  # within 5%: the user's own way
    assert fastest([Tried(d, "oom", 2.8, {}), Tried(e, "oom", 2.0, {})])[0] == e  # an OOM after the setup measured it
    assert fastest([Tried(d, "error", None, {}), Tried(r, "timeout", None, {})]) == (
        d,
        "no variant measured a setup: the default kept",
    )
    line = Tried(d, "ok", 14.2, {"engine.initialize": 13.9, "engine.pinned_alloc": 13.1, "engine.pinned_gib": 10.0})
    assert (
        line.line()
        == "pinned deepspeed: ok, fixed cost 14.2 s [initialize 13.9 s, pinned_alloc 13.1 s, 10.0 GiB pinned]"
    )
    base = ProbeConfig(knobs=Knobs(micro_batch_size=2, max_length=8, eval_batch_size=50, generate=True))
    short = setup_probe(base)
    assert short.knobs.eval_batch_size is None and not short.knobs.generate
    assert (short.warmup_steps, short.measure_steps, short.max_measure_steps) == (1, 1, 1)


def _study(tmp_path: Path) -> SampleStudy:
    url = f"sqlite:///{tmp_path}/t.db"
    study = SampleStudy(url, "gpu-check", {"model": {"source": "builtin:tiny-t5"}, "world_size": 1})
    knobs = Knobs(micro_batch_size=2, max_length=8, zero_stage=2, offload_optimizer=True)
    config = ProbeConfig(knobs=knobs, device_memory=64 * MiB)
    refused = ProbeResult(status="refused", cause="DeepSpeed refuses WarmupLR's warmup_num_steps 0")
    study.probe(config, refused, trial_number=0, config_key="base", fidelity="baseline")
    failed = FailedAllocation(nbytes=8 * MiB, live=60 * MiB, capacity=64 * MiB, phase="train", stage="backward")
    oom = ProbeResult(
        status="oom", ranks=[RankMemory(rank=0, oom_need=68 * MiB, failed_allocation=failed)], setup_s=3.0
    )
    bigger = config.model_copy(update={"knobs": knobs.model_copy(update={"micro_batch_size": 8})})
    study.probe(bigger, oom, trial_number=1, config_key="big")
    ok = ProbeResult(status="ok", samples_per_s=3.0, ranks=[RankMemory(rank=0, peak_allocated=30 * MiB)], setup_s=7.5)
    study.probe(config.model_copy(update={"knobs": knobs.model_copy(update={"micro_batch_size": 4})}), ok,
                trial_number=2, config_key="ok")  # fmt: skip
    return study


def test_a_refused_probe_is_not_a_launched_one_and_the_estimate_reads_the_first_with_ranks(tmp_path: Path) -> None:
    """On a host whose transformers fills warmup 0 the team's trial 0 is refused before launching: before, it counted
    as a measured probe and the estimate column traced its shapes from it, and every line read "estimate: none"."""
    rows = _study(tmp_path).store.probes("gpu-check")
    assert [r.trial_number for r in launched(rows)] == [1, 2]
    source = estimate_source([r for r in rows if r.measured])
    assert source is not None and source.trial_number == 1
    assert first_oom(rows) == (1, None)  # the emulated device keeps no snapshot
    said = [c.line() for c in checks(rows, rows, max_fixed=5, min_probes=3)]
    assert said == [
        "check fixed cost of every launched probe: max 7.5 s (probe 2); probe 2 7.5 s (micro 4 ZeRO-2 offload), "
        "target <= 5 s: FAIL",
        "check probes launched in the budget: 2 (1 refused before launching, not counted), target >= 3: FAIL",
        "check probes out of memory: 1 of 2, target >= 1 (the space and cap are chosen so): ok",
        "check stable configs: trial 2, target a pick: ok",
        "check the team's config (trial 0): refused, target probed: ok",
    ]


def test_the_traces_rerun_on_the_cpu_host_beside_the_returned_files(tmp_path: Path) -> None:
    paths = commands.Paths(ROOT, tmp_path)
    config = plan.from_env({})
    args = commands.oom_message_args(config, paths, f"sqlite:///{tmp_path}/explain.db")
    text = commands.on_the_cpu_host(args, paths)
    assert text.startswith("python -m tuner explain --storage sqlite:///explain.db --oom-message @tests/data/seed/")
    copy = commands.on_the_cpu_host(commands.trial_explain_args(f"sqlite:///{tmp_path}/copy.db", 3), paths)
    assert copy == "python -m tuner explain --storage sqlite:///gpu-check.db --study gpu-check --trial 3"
    assert "--baseline tests/data/seed/ds_config.json" in text and "--max-length 6352" in text
    assert str(tmp_path) not in text
    # their training args' 5.x copy stays on the GPU host: here, their own file at the release it was written for
    assert "--training-args tests/data/seed/training_args.json" in text
    assert text.endswith("--transformers-version 4.57.3")
    snap = "/tmp/gpu-check.x/gpu-check.db.oom-snapshots/2026-rank0.snapshot.pickle"
    assert commands.unzip_snapshot(snap) == (
        "mkdir -p /tmp/gpu-check.x/gpu-check.db.oom-snapshots && gunzip -c oom-snapshot.pickle.gz > " + snap
    )
    spaces = commands.space_yaml("[2, 4, 8]", 512, 200_000_000, searched=True)
    assert "offload_optimizer: [true, false]" in spaces and "micro_batch_size: [2, 4, 8]" in spaces
    theirs = commands.space_yaml("[2, 4, 8]", 6352, 2_000_000, searched=False)
    assert "micro_batch_size: [2]" in theirs and "reduce_bucket_size: [200000000]" in theirs
