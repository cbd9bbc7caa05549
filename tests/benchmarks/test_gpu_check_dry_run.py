"""benchmarks/gpu_check.sh for real on this CPU host (DRY_RUN=1): the same driver (benchmarks/gpu/check.py), its
plan, boxes and deadline; the venv's site-packages stand in for the wheel kit; the team's files (tests/data/seed) as
the baseline on a tiny T5 on the emulated device go through every step (env.txt, the op builds, the pinned variants,
`python -m tuner search`, the crash study, the Seq2SeqTrainer run of the pick with its DeepSpeed export, the tables)
and the CPU traces beside them; the evidence lands in $OUT. Then once more with a forced op-build failure, a search
killed at its box and a Trainer killed at its box, under a shorter deadline: it still ends within it, and $OUT still
holds the database, the per-step verdicts and what else was made (no snapshot: the emulated device keeps none)."""

from __future__ import annotations

import os
import re
import site
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]
WITHOUT_SNAPSHOTS = {"verdicts.txt", "probes.txt", "env.txt", "ops.log", "gpu-check.db", "gpu_check.log"}


def _dry_run(tmp_path: Path, **extra: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    settings = load_settings()
    env = {
        **os.environ,
        "DRY_RUN": "1",
        "KIT_SITE": site.getsitepackages()[0],
        "PYTHON": sys.executable,
        "GPU_CHECK_WORK": str(tmp_path),
        "OUT": str(tmp_path / "out"),
        # the suite's op cache (scripts/test.sh exports TUNER_CACHE_DIR) for the check's probes and for its Trainer
        # run, which otherwise compiled DeepSpeed's shm comm again into torch's default ~/.cache/torch_extensions
        "TUNER_CACHE_DIR": str(settings.cache_dir),
        **extra,
    }
    env.pop("TUNER_PINNED_ALLOC", None)
    # the dry run's ops step checks ops already built ("(cached)": its 90 s box is not a first build's 2-core time);
    # on a fresh machine nothing else may have built them yet, so the user's own step comes first, outside the clock
    prepared = subprocess.run(
        [sys.executable, "-m", "tuner", "prepare"], env=env, capture_output=True, text=True, timeout=900
    )
    assert prepared.returncode == 0, prepared.stdout[-3000:] + prepared.stderr[-3000:]
    proc = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], env=env, capture_output=True, text=True, timeout=870
    )
    return proc, tmp_path / "out"


def _took(out: str) -> tuple[float, float]:
    found = re.search(r"the check took (\d+) s of its (\d+) s deadline", out)
    assert found is not None, out[-3000:]
    return float(found.group(1)), float(found.group(2))


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_the_gpu_check_dry_run_passes_on_cpu(tmp_path: Path) -> None:
    proc, evidence = _dry_run(tmp_path)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert out.splitlines()[0] == "plan (dry run, CPU): deadline 780 s" and "within the deadline (780 s)" in out
    for step in ("kit", "env", "ops", "pinned", "search", "crash", "trainer", "tables", "evidence"):
        assert re.search(rf"^step {step}: PASS in \d+ s \(box \d+ s\)", out, re.MULTILINE), step
    took, deadline = _took(out)
    assert took <= deadline
    assert "gpu: none (the emulated device)" in out and "probe pinned allocation: deepspeed" in out
    assert "op cpu_adam: built (or found cached) in " in out and "op shm_comm: " in out
    # the pinned variants, each its fixed cost; the one kept said
    for variant in ("deepspeed", "register:", "exact"):
        assert re.search(rf"^pinned {variant}\S*: (ok|oom), fixed cost \d+\.\d s \[", out, re.MULTILINE), variant
    assert "pinned: kept " in out
    assert "probe 0 (baseline): micro 2 ZeRO-2 offload overlap:" in out  # the team's config is trial 0
    assert "fixed cost" in out and "peak allocated" in out and "device-used" in out and "need" in out
    assert "engine.initialize" in out and "memory_window" in out and "timed cycles, spread" in out
    # every assertion names its figure and its target
    assert re.search(r"^check probes launched in the budget: \d+, target >= 2: ok$", out, re.MULTILINE)
    assert "check the team's config at its worst batch: oom, 1 refused allocation(s) recorded" in out
    assert "check OOM over the Trainer's steps, eval and generate: 0, target 0: ok" in out
    assert "check tokens the eval generated: 16, target the probe's 16: ok" in out  # not transformers' 20
    assert "Trainer verdict: PASS" in out and "(deepspeed True)" in out
    # the CPU traces beside the steps: the OOM explained from its record, their OOM text read back, the estimates
    assert "== tuner explain --study gpu-check --trial 0" in out
    assert "recorded failure, rank 0: tried to allocate" in out
    assert "your OOM message: tried to allocate 4.81 GiB, capacity 79.15 GiB" in out
    assert "estimate / measured allocated: train " in out
    assert out.splitlines()[-1] == "GPU CHECK PASS"
    # quiet: only the check's own lines (DeepSpeed's logger, tqdm and the search's table are in the log)
    assert not [line for line in out.splitlines() if line.startswith("[20") or "it/s]" in line]
    assert {p.name for p in evidence.iterdir()} == WITHOUT_SNAPSHOTS  # <= 8 files; no snapshot on the CPU
    assert "trial   0" in (evidence / "gpu_check.log").read_text()
    assert (evidence / "verdicts.txt").read_text().rstrip().endswith("GPU CHECK PASS")
    assert "cpu_adam" in (evidence / "ops.log").read_text()


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_the_gpu_check_brings_its_evidence_back_whatever_fails(tmp_path: Path) -> None:
    proc, evidence = _dry_run(
        tmp_path, GPU_CHECK_FORCE="ops-fail,search-timeout,trainer-kill", GPU_CHECK_DEADLINE="330"
    )
    out = proc.stdout
    assert proc.returncode == 1, out[-3000:] + proc.stderr[-3000:]
    took, deadline = _took(out)
    assert deadline == 330 and took <= deadline
    # each failure said in one line, and the next step ran
    assert re.search(r"^op cpu_adam: FAIL in \d+\.\d s: .*Error building extension 'cpu_adam'", out, re.MULTILINE)
    assert re.search(r"^step ops: FAIL .*\(forced: a compiler that refuses every source\)$", out, re.MULTILINE)
    assert re.search(r"^step pinned: PASS", out, re.MULTILINE)  # the probes' own op cache was never touched
    assert re.search(r"^step search: TIMEOUT in \d+ s \(box 30 s\): stopped at its box; .*database copied", out, re.M)
    assert re.search(r"^step trainer: TIMEOUT in \d+ s \(box 3 s\): stopped at its box", out, re.MULTILINE)
    assert "check the Trainer's result: none (killed at its box" in out
    assert re.search(r"^step evidence: PASS", out, re.MULTILINE)
    assert out.splitlines()[-1].startswith("GPU CHECK FAIL: ops, search, ") and "trainer" in out.splitlines()[-1]
    # the evidence: the database (the study the killed search created), the verdicts, the op builds' words
    assert {p.name for p in evidence.iterdir()} >= WITHOUT_SNAPSHOTS and len(list(evidence.iterdir())) <= 8
    with sqlite3.connect(evidence / "gpu-check.db") as conn:
        assert ("gpu-check",) in conn.execute("select name from tuner_studies").fetchall()
    verdicts = (evidence / "verdicts.txt").read_text()
    assert "step search: TIMEOUT" in verdicts and "step trainer: TIMEOUT" in verdicts
    assert verdicts.rstrip().splitlines()[-1].startswith("GPU CHECK FAIL: ")
    assert (
        "fatal error: Python.h: No such file or directory (the GPU check's forced op-build failure)"
        in (evidence / "ops.log").read_text()
    )
