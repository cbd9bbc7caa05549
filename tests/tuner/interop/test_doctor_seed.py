"""`tuner doctor` on the seed case (issue 22 §3): the motivating team's DeepSpeed JSON and training args with
builtin:flan-t5-large on 4 ranks. Each finding's number is the one `tuner estimate` prints for that part, and the
findings are ranked by those numbers. Both commands run in process over the flan-t5-large trace recorded for the
seed case (tests/data/seed/flan-t5-large-trace.json; see tests/tuner/cli/test_explain_seed.py), not a fresh one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

SEED = Path(__file__).resolve().parents[2] / "data" / "seed"
MiB = 1 << 20
JOB = ["--model", "builtin:flan-t5-large", "--world-size", "4"]
# their file has overwrite_output_dir (gone in transformers 5): read as the 4.x release they train on
FILES = ["--training-args", str(SEED / "training_args.json"), "--transformers-version", "4.57.3"]


def _run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *args: str) -> str:
    import tuner.cli.estimate as estimate
    from tuner.cli.app import _register, app
    from tuner.memory.trace import Trace

    recorded = Trace.model_validate_json((SEED / "flan-t5-large-trace.json").read_text())
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPUs: the launcher/allocator checks are skipped, said so
    monkeypatch.setattr(estimate, "trace", lambda *a, **k: recorded)
    _register()
    done = CliRunner().invoke(app, list(args))
    assert done.exit_code == 0, done.output
    return done.stdout


def _estimate_part(body: dict, phase: str, part: str) -> int:
    (rank,) = body["ranks"]
    (found,) = [p for p in rank["phases"] if p["phase"] == phase]
    return sum(p["bytes"] for p in found["parts"] if p["name"] == part)


def test_the_seed_findings_carry_the_estimates_numbers_ranked(monkeypatch, tmp_path):
    estimate = json.loads(
        _run(monkeypatch, tmp_path, "estimate", *JOB, "--baseline", str(SEED / "ds_config.json"), *FILES, "--json")
    )
    doctor = json.loads(
        _run(monkeypatch, tmp_path, "doctor", "--ds-config", str(SEED / "ds_config.json"), *FILES, *JOB, "--json")
    )
    by_code = {f["code"]: f for f in doctor["findings"]}

    # the bucket finding: tuner estimate's ZeRO buffers row, in the train phase where it is largest
    buckets = max(_estimate_part(estimate, p, "ZeRO buffers") for p in ("forward_backward", "optimizer_step"))
    assert (
        by_code["overlap-comm-buckets"]["nbytes"]
        == buckets
        == _estimate_part(estimate, "optimizer_step", "ZeRO buffers")
    )
    assert (
        f"ZeRO buffers {buckets / MiB:,.1f} MiB ({buckets / (1 << 30):.2f} GiB)"
        in by_code["overlap-comm-buckets"]["number"]
    )

    # the eval-batch finding: generate's activations + generation cache at eval batch 50, qualified by when eval runs
    gen = _estimate_part(estimate, "generate", "activations + temporaries") + _estimate_part(
        estimate, "generate", "generation cache"
    )
    evals = by_code["eval-batch-generate"]
    assert evals["nbytes"] == gen and "at the end of the first epoch (eval_strategy: epoch)" in evals["number"]
    assert "eval-accumulation" not in by_code  # predict_with_generate keeps token ids, not logits

    # ranked by the numbers, largest first; those without one after, each saying why
    numbers = [f["nbytes"] for f in doctor["findings"] if f["nbytes"] is not None]
    assert numbers == sorted(numbers, reverse=True) and len(numbers) == 2
    assert [f["nbytes"] is None for f in doctor["findings"]] == sorted(f["nbytes"] is None for f in doctor["findings"])
    assert all(f["number"].startswith("no number") for f in doctor["findings"] if f["nbytes"] is None)
    assert {"no-truncation", "logging-every-step", "skipped-gpu-checks"} <= set(by_code)
    assert doctor["estimate"]["not_covered"] == estimate["not_covered"] and doctor["estimate"]["calibrated"] is False
    # which precision mode was traced, and why: their DeepSpeed bf16 (issue 32), the same line as tuner estimate's
    assert doctor["estimate"]["precision_traced"] == estimate["precision_traced"]
    assert estimate["precision_traced"].startswith("precision traced: bf16, the module cast to bf16 (the job trains")

    text = _run(monkeypatch, tmp_path, "doctor", "--ds-config", str(SEED / "ds_config.json"), *FILES, *JOB)
    assert f"ZeRO buffers {buckets / MiB:,.1f} MiB" in text and estimate["not_covered"] in text
    assert estimate["precision_traced"] in text.replace("\n", " ")
    # the buckets (1.18 GiB) before the eval batch: generate at eval batch 50 is 50 x its per-sample bytes, autocast's
    # weight copies not among them (a DeepSpeed bf16 module has none; counted per sample they made it 17.4 GiB)
    order = [text.index(f"({code})") for code in ("overlap-comm-buckets", "eval-batch-generate", "no-truncation")]
    assert order == sorted(order)
    assert by_code["eval-batch-generate"]["nbytes"] < by_code["overlap-comm-buckets"]["nbytes"]

    # the training args alone name their DeepSpeed file: the same estimate, the same number
    alone = json.loads(_run(monkeypatch, tmp_path, "doctor", *FILES, *JOB, "--json"))
    assert {f["code"]: f["nbytes"] for f in alone["findings"]}["overlap-comm-buckets"] == buckets
