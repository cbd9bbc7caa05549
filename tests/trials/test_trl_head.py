"""TRL's fused LM head in the probe and the trace (trials.trl_head, tuner.job.trl_head), against TRL 1.16.0 itself
(installed beside the venv with pip --target: tests/tuner/job/test_ledger_trl.trl_folder; TRL is not a dependency).

A TRL SFT / DPO recipe's probe patches the model with TRL's own ``add_fused_lm_head`` and takes its loss through it,
as SFTTrainer / DPOTrainer do: the same loss as the full logits, and a peak holding TRL's tile of min(tokens, 4096) x
32768 instead of the (batch, length, vocabulary) logits; the trace runs the same head and agrees with the probe.
Without TRL beside tuner the dry run says, in one line, that the probe computes the full logits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.tuner.job.test_ledger_trl import trl_folder
from trials.contract import DpoSpec, JobSettings, Knobs, ModelSpec, ProbeConfig, TrlHead
from tuner.job.trl_head import DPO_OUTPUTS, FUSED, NOT_INSTALLED, OLDER, SFT_OUTPUTS, head_line, trl_head_of

ROOT = Path(__file__).resolve().parents[2]
LLAMA = ModelSpec(source="builtin:tiny-llama")  # vocabulary 512, hidden 64
VOCAB, TILE_COLUMNS = 512, 32768  # TRL 1.16's _CHUNKED_LOGPROB_CHUNK_SIZE: the tile's width, whatever the vocabulary
SFT_HEAD = TrlHead(version="1.16.0", outputs=SFT_OUTPUTS)
DPO_HEAD = TrlHead(version="1.16.0", outputs=DPO_OUTPUTS)
MICRO, LENGTH = 4, 128
SFT: dict[str, Any] = {"output_dir": "out", "per_device_train_batch_size": 2, "max_length": 64, "packing": False}
SAME = r"""
import json, torch
from trials.contract import DpoSpec, ModelSpec, TrlHead
from trials.data import worst_case_batch
from trials.dpo import frozen, pairs, sequence_logps
from trials.models import build_model
from trials.trl_head import fuse, sft_loss

torch.manual_seed(0)
model = build_model(ModelSpec(source="builtin:tiny-llama"))
batch = worst_case_batch(4, 128, 512, seed=0, encoder_decoder=False)
full = model(**batch).loss
full.backward()
full_grad = model.lm_head.weight.grad.clone()
model.zero_grad()
fuse(TrlHead(version="1.16.0", outputs=("log_probs", "entropy", "is_top1")), model)
fused = sft_loss(model, batch)
fused.backward()
torch.manual_seed(1)
llama = ModelSpec(source="builtin:tiny-llama")
policy, reference = build_model(llama), frozen(build_model(llama))
dpo = pairs(worst_case_batch(4, 64, 512, seed=0, encoder_decoder=False), DpoSpec())
plain = [sequence_logps(m, dpo).tolist() for m in (policy, reference)]
fuse(TrlHead(version="1.16.0", outputs=("log_probs", "entropy", "mean_logits", "is_top1")), policy, reference)
print(json.dumps({"full": full.item(), "fused": fused.item(), "patched": type(model.forward).__name__,
                  "grad": (model.lm_head.weight.grad - full_grad).abs().max().item(), "plain": plain,
                  "through_head": [sequence_logps(m, dpo, fused=True).tolist() for m in (policy, reference)]}))
"""
TRACE = r"""
import json, sys
from trials.contract import TrlHead, DpoSpec, ModelSpec
from trials.estimate import trace_point
from trials.trace_trainer import TracedTrainer

head = TrlHead.model_validate_json(sys.argv[1]) if sys.argv[1] != "null" else None
dpo = DpoSpec() if sys.argv[2] == "dpo" else None
trainer = TracedTrainer(args=json.loads(sys.argv[3]), dpo=dpo, trl_head=head)
point = trace_point(ModelSpec(source="builtin:tiny-llama"), 4, 128, False, "fp32", trainer=trainer)
print(json.dumps(point["point"]))
"""


def _env(trl: bool = True) -> dict[str, str]:
    path = [str(ROOT), *([str(trl_folder())] if trl else [])]
    return {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": os.pathsep.join(path)}


def _run(*argv: str, trl: bool = True, cwd: Path | None = None) -> str:
    done = subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, timeout=300, env=_env(trl), cwd=cwd or ROOT
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


def _probe_peak(tmp_path: Path, name: str, job: JobSettings) -> int:
    knobs = Knobs(micro_batch_size=MICRO, max_length=LENGTH, engine="torch")
    config = ProbeConfig(model=LLAMA, knobs=knobs, job=job, warmup_steps=2, measure_steps=2)
    path, out = tmp_path / f"{name}.json", tmp_path / f"{name}.out.json"
    path.write_text(config.model_dump_json())
    _run("-m", "trials", "--config", str(path), "--out", str(out))
    result = json.loads(out.read_text())
    assert result["status"] == "ok", result.get("cause")
    return int(result["memory"]["peak_allocated"])


def _traced_peak(head: TrlHead | None, kind: str, args: dict[str, Any] | None = None) -> int:
    said = _run("-c", TRACE, head.model_dump_json() if head is not None else "null", kind, json.dumps(args))
    return int(json.loads(said.strip().splitlines()[-1])["peak_bytes"])


def test_trls_head_gives_the_full_logits_loss_and_its_log_probs() -> None:
    """The same model and batch: TRL's fused loss equals the model's own (its full logits' cross entropy), with the
    same head gradient, and DPO's summed completion log-probs through the head equal the full logits' (policy and
    reference, each patched as DPOTrainer patches them). fp32 on a CPU: the head sums the same terms in another
    order (vocabulary tiles, online logsumexp), so equal to float rounding."""
    said = json.loads(_run("-c", SAME).strip().splitlines()[-1])
    assert said["patched"] == "method"  # model.forward is TRL's _fused_forward, bound to the model
    assert said["fused"] == pytest.approx(said["full"], rel=1e-6)
    assert said["grad"] < 1e-6
    for plain, through in zip(said["plain"], said["through_head"], strict=True):
        assert through == pytest.approx(plain, rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sft", "dpo"])
def test_the_probe_holds_trls_tile_and_the_trace_agrees(tmp_path: Path, kind: str) -> None:
    """A probe with TRL's head holds its tile of min(tokens, 4096) x 32768 fp32 (CPU: every position is scored) in
    place of the (rows, length, 512) logits: its peak is above the full-logits probe's by at least the tile (the
    forward's tile is freed before the backward allocates its own: one at a time) and by at most the tile plus 8
    tokens x vocabulary fp32 temporaries (the CPU fold's z, exp, p, grad over a tile's 512 live columns, the full
    logits the other probe held, the fp32 gradient accumulators of tokens x 64 and 512 x 64: each under one such).
    DPO's rows are 2 x micro (chosen, rejected): its tile twice SFT's. The trace (fake tensors) runs TRL's same head
    and agrees with each probe to 0.01% (a fake trace and the emulated device differ by a few bytes of alignment)."""
    dpo, head = (DpoSpec(), DPO_HEAD) if kind == "dpo" else (None, SFT_HEAD)
    full = _probe_peak(tmp_path, "full", JobSettings(dpo=dpo))
    fused = _probe_peak(tmp_path, "fused", JobSettings(dpo=dpo, trl_head=head))
    tokens = MICRO * (2 if dpo else 1) * (LENGTH - 1)  # the shifted positions of every row
    tile, temporaries = min(tokens, 4096) * TILE_COLUMNS * 4, tokens * VOCAB * 4
    assert tile <= fused - full <= tile + 8 * temporaries, (full, fused, tile)
    for head_run, probed in ((None, full), (head, fused)):
        assert _traced_peak(head_run, kind) == pytest.approx(probed, rel=1e-4), (head_run, probed)


def test_with_label_smoothing_the_loss_takes_the_full_logits_and_the_head_runs_for_the_metrics() -> None:
    """SFTTrainer with label_smoothing_factor: their label smoother over the full logits (with grad), then a no-grad
    forward through the fused head for its metrics while the step's activations are alive: the trace holds the
    smoothed full-logits step and, above it, at least the head's forward tile (min(tokens, 4096) x 32768 fp32)."""
    args = {"label_smoothing_factor": 0.1}
    full, fused = _traced_peak(None, "sft", args), _traced_peak(SFT_HEAD, "sft", args)
    assert fused - full >= MICRO * (LENGTH - 1) * TILE_COLUMNS * 4, (full, fused)


def test_without_trl_beside_tuner_the_dry_run_says_the_probe_computes_the_full_logits(tmp_path: Path) -> None:
    """Where TRL >= 1.16 is installed the SFT / DPO recipe's job carries its head (the trainer's outputs); where it is
    not (or older) the job has none, so the probe computes the full logits, and the dry run's sources line says so in
    one line, never silently. A plain training-args file is no recipe: no head, no line."""
    assert trl_head_of(SFT, "1.16.0") == SFT_HEAD
    assert trl_head_of({"max_length": 64, "beta": 0.1, "use_weighting": True}, "1.16.0") == TrlHead(
        version="1.16.0", outputs=(*DPO_OUTPUTS, "log_sum_sq_probs")
    )
    assert trl_head_of(SFT, "1.15.2") is None and head_line(None, "1.15.2") == OLDER.format("1.15.2")
    assert trl_head_of({"output_dir": "out", "max_length": 64}, "1.16.0") is None
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps(SFT))
    search = ["-m", "tuner", "search", "--model", "builtin:tiny-llama", "--baseline", str(recipe), "--budget", "2m"]
    search += ["--storage", f"sqlite:///{tmp_path / 't.db'}", "--dry-run"]
    without = " ".join(_run(*search, trl=False, cwd=tmp_path).split())
    assert NOT_INSTALLED in without and "fused LM head, as its trainer" not in without
    with_trl = " ".join(_run(*search, cwd=tmp_path).split())
    assert FUSED.format("1.16.0") in with_trl and NOT_INSTALLED not in with_trl


@pytest.mark.slow
def test_an_fsdp2_probe_with_trls_head_reads_what_its_trace_says(monkeypatch: pytest.MonkeyPatch) -> None:
    """FSDP2 on 2 gloo ranks: TRL's head gathers the sharded LM head (``full_tensor``) and runs its tiles; the
    estimate traces FSDP2 with the same head (trials.trace_fsdp) and reads the probe's train peak to 0.1%, with and
    without the head (measured: 81,079,008 B against 81,078,984 B with it, 9,645,360 / 9,645,336 B without)."""
    from tuner.memory.estimator import Estimator, fsdp_at, trace
    from tuner.memory.trace import TraceTrainer
    from tuner.probing.config import probe_config
    from tuner.probing.runner import ProbeRunner
    from tuner.settings import load_settings

    monkeypatch.setenv("PYTHONPATH", _env()["PYTHONPATH"])  # the ranks and the trace run with TRL beside tuner
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    knobs = Knobs(micro_batch_size=MICRO, max_length=LENGTH, engine="fsdp2")
    # fresh ranks (spawn), so they start with TRL on the path: this test process's fork server, where an earlier test
    # started one, holds the environment it was started with
    runner = ProbeRunner(load_settings(), launcher="spawn")
    peaks = {}
    for head in (None, SFT_HEAD):
        job = JobSettings(trl_head=head)
        result = runner(probe_config(knobs=knobs, model=LLAMA, world_size=2, gradient_accumulation_steps=1, job=job))
        assert result.status == "ok" and result.sharded is True, result.cause
        traced = trace(LLAMA, [], fsdp_points=[fsdp_at(knobs, 2, False)], trainer=TraceTrainer(trl_head=head))
        phases = {p.phase: p.total for p in Estimator(traced, 2, 8).breakdown(knobs).worst.phases}
        estimate = max(phases["forward_backward"], phases["optimizer_step"])
        assert estimate == pytest.approx(result.phase_peaks["train"], rel=1e-3), (head, estimate, result.phase_peaks)
        peaks[head is not None] = result.phase_peaks["train"]
    assert peaks[True] - peaks[False] >= min(MICRO * (LENGTH - 1), 4096) * TILE_COLUMNS * 4
