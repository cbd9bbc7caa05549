"""`tuner doctor`: each trap, table-driven; then through the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from trials.contract import Knobs
from tuner.errors import BaselineError
from tuner.interop.baseline import parse_baseline
from tuner.interop.doctor import Basis, Finding, diagnose, visible_gpus
from tuner.memory.breakdown import ACTIVATIONS, GENERATE, GENERATION_CACHE, OPTIMIZER_STEP, ZERO_BUFFERS
from tuner.memory.estimator import Estimator, Trace, TracePoint

MiB = 1 << 20

DS = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 1,
    "zero_optimization": {
        "stage": 2,
        "offload_optimizer": {"device": "cpu"},
        "overlap_comm": True,
        "reduce_bucket_size": 2e8,
        "allgather_bucket_size": 2e8,
    },
}
ARGS = {
    "per_device_train_batch_size": 4,
    "per_device_eval_batch_size": 4,
    "max_source_length": 512,
    "logging_steps": 50,
}
QUIET_ENV = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def codes(ds: dict | None, hf: dict | None, env: dict | None = None, gpus: int | None = 0) -> set[str]:
    _, findings = diagnose(ds, hf, env=env if env is not None else QUIET_ENV, gpus=gpus)
    return {f.code for f in findings}


def zero(**kw: Any) -> dict:
    return {**DS, "zero_optimization": {**DS["zero_optimization"], **kw}}


@pytest.mark.parametrize(
    ("ds", "hf", "env", "gpus", "present", "absent"),
    [
        # the team's trap: ZeRO-2 offload + overlap_comm + 2e8 buckets
        (DS, ARGS, None, 0, {"overlap-comm-buckets"}, {"eval-batch-generate", "no-truncation"}),
        (zero(overlap_comm=False), ARGS, None, 0, set(), {"overlap-comm-buckets"}),
        (zero(reduce_bucket_size=5e7, allgather_bucket_size=5e7), ARGS, None, 0, set(), {"overlap-comm-buckets"}),
        (zero(offload_optimizer={"device": "none"}), ARGS, None, 0, set(), {"overlap-comm-buckets"}),
        # unset buckets are DeepSpeed's 5e8 default: flagged
        (
            {**DS, "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}, "overlap_comm": True}},
            ARGS,
            None,
            0,
            {"overlap-comm-buckets"},
            set(),
        ),
        # eval batch far above the train batch with generate
        (
            DS,
            {**ARGS, "per_device_eval_batch_size": 32, "predict_with_generate": True},
            None,
            0,
            {"eval-batch-generate"},
            {"eval-accumulation"},  # generate keeps token ids, not logits: nothing of the vocabulary's size piles up
        ),
        (DS, {**ARGS, "per_device_eval_batch_size": 32}, None, 0, set(), {"eval-batch-generate"}),
        (
            DS,
            {**ARGS, "per_device_eval_batch_size": 4, "predict_with_generate": True, "eval_accumulation_steps": 4},
            None,
            0,
            set(),
            {"eval-batch-generate", "eval-accumulation"},
        ),
        (DS, {**ARGS, "eval_strategy": "steps"}, None, 0, {"eval-accumulation"}, set()),
        # the Trainer's default eval batch (8) against micro 2, with generate
        (
            None,
            {"per_device_train_batch_size": 2, "max_seq_length": 64, "predict_with_generate": True},
            None,
            0,
            {"eval-batch-generate"},
            {"overlap-comm-buckets"},
        ),
        # truncation
        (DS, {k: v for k, v in ARGS.items() if k != "max_source_length"}, None, 0, {"no-truncation"}, set()),
        # logging every step, in the Trainer or in DeepSpeed
        (DS, {**ARGS, "logging_steps": 1}, None, 0, {"logging-every-step"}, {"deepspeed-logging"}),
        ({**DS, "steps_per_print": 1}, ARGS, None, 0, {"deepspeed-logging"}, {"logging-every-step"}),
        ({**DS, "wall_clock_breakdown": True}, ARGS, None, 0, {"deepspeed-logging"}, set()),
        # several GPUs and no launcher; with a launcher's env it is fine
        (DS, ARGS, {}, 4, {"gpus-without-launcher", "allocator-fragmentation"}, set()),
        (
            DS,
            ARGS,
            {"WORLD_SIZE": "4", "LOCAL_RANK": "0", **QUIET_ENV},
            4,
            set(),
            {"gpus-without-launcher", "allocator-fragmentation"},
        ),
        (DS, ARGS, {}, 1, {"allocator-fragmentation"}, {"gpus-without-launcher"}),
        (DS, ARGS, {}, None, {"skipped-gpu-checks"}, {"gpus-without-launcher", "allocator-fragmentation"}),
        (DS, ARGS, {}, 0, {"skipped-gpu-checks"}, {"gpus-without-launcher", "allocator-fragmentation"}),
        (DS, ARGS, {}, 2, set(), {"skipped-gpu-checks"}),
        # "auto" without training args: the ZeRO checks still run, the batch checks say what they need
        (
            {**zero(), "train_micro_batch_size_per_gpu": "auto"},
            None,
            None,
            0,
            {"overlap-comm-buckets", "auto-needs-training-args", "no-training-args"},
            set(),
        ),
        # a clean setup has no warnings at all
        (
            zero(overlap_comm=False),
            {**ARGS, "eval_accumulation_steps": 8},
            None,
            0,
            set(),
            {"overlap-comm-buckets", "eval-batch-generate", "eval-accumulation", "no-truncation", "logging-every-step"},
        ),
    ],
)
def test_traps(ds: dict | None, hf: dict | None, env: dict | None, gpus: int | None, present: set, absent: set) -> None:
    got = codes(ds, hf, env, gpus)
    assert present <= got, got
    assert not (absent & got), got


def test_every_finding_says_what_to_try_and_how_the_search_tests_it() -> None:
    hf = {
        **{k: v for k, v in ARGS.items() if k != "max_source_length"},
        "per_device_eval_batch_size": 32,
        "predict_with_generate": True,
        "logging_steps": 1,
        "bf16": True,
    }
    _, findings = diagnose({**DS, "steps_per_print": 1, "bf16": {"enabled": True}}, hf, env={}, gpus=4)
    assert len(findings) >= 7  # no eval-accumulation: predict_with_generate keeps token ids
    for f in findings:
        assert f.title and f.why and f.fix and f.number, f.code
        assert f.search or f.severity == "info", f.code
    overlap = next(f for f in findings if f.code == "overlap-comm-buckets")
    assert "overlap_comm: [false, true]" in overlap.search
    # no model: no bytes (no rule of thumb in their place), and a note that says so
    assert overlap.nbytes is None and "without --model" in overlap.number
    assert "skipped-numbers" in {f.code for f in findings}
    assert [f.severity for f in findings] == sorted((f.severity for f in findings), key=lambda s: s != "warn")


PARAMS, LARGEST = 800_000_000, 32_000_000


def basis(ds: dict, hf: dict, *, train: int = 2 << 30, eval_per_sample: int = 64 << 20) -> Basis:
    """The estimate of the setup over a trace of its own shape (one point, its eval phases at one sample a batch)."""
    knobs = Knobs.model_validate(parse_baseline(ds, hf, max_length=512).knobs)
    point = TracePoint(
        micro_batch_size=knobs.micro_batch_size,
        max_length=knobs.max_length,
        precision=knobs.precision,
        activation_bytes=train,
        resident_activation_bytes=train,
        eval_batch_size=1,
        eval_bytes=eval_per_sample,
        generate_bytes=eval_per_sample,
        generate_cache_bytes=eval_per_sample // 4,
    )
    trace = Trace(param_count=PARAMS, param_bytes=4 * PARAMS, largest_param=LARGEST, points=[point])
    return Basis(Estimator(trace=trace, world_size=4), knobs, "a test model on 4 ranks")


def found(ds: dict, hf: dict, b: Basis) -> dict[str, Finding]:
    return {f.code: f for f in diagnose(ds, hf, env=QUIET_ENV, gpus=0, basis=b)[1]}


def test_the_bucket_number_is_the_estimates_zero_buffers_part_and_fp32_doubles_it() -> None:
    nbytes = {}
    for precision, ds, hf in (("bf16", {**DS, "bf16": {"enabled": True}}, {**ARGS, "bf16": True}), ("fp32", DS, ARGS)):
        b = basis(ds, hf)
        assert b.knobs.precision == precision
        part = b.estimator.breakdown(b.knobs).worst.phase(OPTIMIZER_STEP).part(ZERO_BUFFERS)
        f = found(ds, hf, b)["overlap-comm-buckets"]
        assert f.nbytes == part and f"ZeRO buffers {part / MiB:,.1f} MiB" in f.number and "optimizer step" in f.number
        assert "with 5e7 buckets" in f.number and "less" in f.number and f.not_covered
        nbytes[precision] = part
    assert nbytes["fp32"] == 2 * nbytes["bf16"]  # every bucket at the job's precision


@pytest.mark.parametrize(
    ("eval_per_sample", "first"), [(256 << 20, "eval-batch-generate"), (1 << 20, "overlap-comm-buckets")]
)
def test_findings_are_ranked_by_their_number(eval_per_sample: int, first: str) -> None:
    hf = {**ARGS, "eval_strategy": "steps", "per_device_eval_batch_size": 32, "predict_with_generate": True}
    hf["logging_steps"] = 1
    b = basis(DS, hf, eval_per_sample=eval_per_sample)
    ranked = diagnose(DS, hf, env=QUIET_ENV, gpus=0, basis=b)[1]
    numbers = [f.nbytes for f in ranked if f.nbytes is not None]
    assert ranked[0].code == first and len(numbers) == 2
    assert numbers == sorted(numbers, reverse=True)
    assert all(f.nbytes is not None for f in ranked[: len(numbers)])  # those without a number come after
    assert "skipped-numbers" not in {f.code for f in ranked}
    gen = b.estimator.breakdown(b.knobs).worst.phase(GENERATE)
    assert found(DS, hf, b)["eval-batch-generate"].nbytes == gen.part(ACTIVATIONS) + gen.part(GENERATION_CACHE)


def test_broken_config_is_an_error_not_a_finding() -> None:
    with pytest.raises(BaselineError, match=r"zero_optimization\.bogus"):
        diagnose(zero(bogus=1), ARGS, env={}, gpus=0)


@pytest.mark.parametrize(
    ("env", "gpu_dirs", "expect"),
    [
        ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, 0, 4),
        ({"CUDA_VISIBLE_DEVICES": "2"}, 8, 1),
        ({"CUDA_VISIBLE_DEVICES": ""}, 8, 0),
        ({"CUDA_VISIBLE_DEVICES": "-1"}, 8, 0),
        ({}, 8, 8),
        ({}, 0, None),
    ],
)
def test_visible_gpus(tmp_path: Path, env: dict, gpu_dirs: int, expect: int | None) -> None:
    for i in range(gpu_dirs):  # the layout the NVIDIA driver exposes under /proc
        (tmp_path / "proc" / "driver" / "nvidia" / "gpus" / f"0000:{i:02x}:00.0").mkdir(parents=True)
    assert visible_gpus(env, root=tmp_path) == expect


# -- through the real entry point ------------------------------------------------------------------------------------
TUNER = [sys.executable, "-c", "from tuner.cli import main; main()"]


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "LOCAL_RANK", "RANK")}
    return subprocess.run([*TUNER, *args], capture_output=True, text=True, env={**full, **(env or {})}, timeout=120)


def write(path: Path, data: Any) -> Path:
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_doctor_cli(tmp_path: Path) -> None:
    ds = write(tmp_path / "ds.json", DS)
    args = write(tmp_path / "args.json", {**ARGS, "per_device_eval_batch_size": 32, "predict_with_generate": True})
    proc = run("doctor", "--ds-config", str(ds), "--training-args", str(args), env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert proc.returncode == 0, proc.stderr
    assert "overlap-comm-buckets" in proc.stdout and "eval-batch-generate" in proc.stdout
    assert "gpus-without-launcher" in proc.stdout and "tuner search:" in proc.stdout
    assert run("doctor", "--ds-config", str(ds), "--strict").returncode == 1
    clean = write(tmp_path / "clean.json", zero(overlap_comm=False))
    assert run("doctor", "--ds-config", str(clean), "--strict", env={"CUDA_VISIBLE_DEVICES": ""}).returncode == 0
    out = run(
        "doctor", "--ds-config", str(ds), "--training-args", str(args), "--json", env={"CUDA_VISIBLE_DEVICES": ""}
    )
    doc = json.loads(out.stdout)
    # training args naming their DeepSpeed file (relative to themselves) are enough
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub" / "z.json", DS)
    named = write(tmp_path / "sub" / "a.json", {**ARGS, "deepspeed": "z.json"})
    alone = run("doctor", "--training-args", str(named), "--json", env={"CUDA_VISIBLE_DEVICES": ""})
    assert "overlap-comm-buckets" in {f["code"] for f in json.loads(alone.stdout)["findings"]}, alone.stderr
    assert doc["knobs"]["zero_stage"] == 2 and {"overlap-comm-buckets", "eval-batch-generate"} <= {
        f["code"] for f in doc["findings"]
    }


@pytest.mark.parametrize(
    ("files", "extra", "match"),
    [
        ({}, [], "give --ds-config FILE and/or --training-args FILE"),
        ({"--ds-config": "{broken"}, [], "not valid JSON"),
        ({"--ds-config": ARGS}, [], "looks like training args"),
        ({"--ds-config": zero(stage=5)}, [], "stage must be 0, 1, 2 or 3"),
        ({"--ds-config": {**DS, "train_batch_size": 7}}, [], "train_batch_size=7"),
        ({"--ds-config": "missing"}, [], "cannot read"),
        ({"--ds-config": DS}, ["--world-size", "4"], "--world-size goes with --model"),
        ({"--ds-config": DS}, ["--model", "builtin:no-such-preset"], "no-such-preset"),
        ({"--ds-config": DS}, ["--oom-message", "it crashed"], "no 'Tried to allocate <size>'"),
    ],
)
def test_doctor_cli_mistakes_are_one_line_exit_2(tmp_path: Path, files: dict, extra: list, match: str) -> None:
    argv: list[str] = []
    for option, content in files.items():
        path = tmp_path / "f.json"
        if content != "missing":
            write(path, content)
        argv += [option, str(path)]
    proc = run("doctor", *argv, *extra)
    assert proc.returncode == 2
    assert match in proc.stderr and len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


SEED = Path(__file__).resolve().parents[2] / "data" / "seed"


def test_the_seed_files_eval_findings_say_when_eval_first_runs_and_generate_keeps_token_ids() -> None:
    ds = json.loads((SEED / "ds_config.json").read_text())
    hf = json.loads((SEED / "training_args.json").read_text())
    _, found = diagnose(ds, hf, env={}, gpus=None)
    by_code = {f.code: f for f in found}
    assert "eval-accumulation" not in by_code  # predict_with_generate: token ids, not logits
    assert "at the end of the first epoch (eval_strategy: epoch)" in by_code["eval-batch-generate"].why
    assert "skipped-gpu-checks" in by_code and "launcher and allocator" in by_code["skipped-gpu-checks"].title


def test_training_args_this_transformers_does_not_accept_are_named_with_the_version_that_does() -> None:
    hf = {**ARGS, "overwrite_output_dir": True}
    accepted = frozenset(k for k in ARGS) | {"output_dir"}
    _, found = diagnose(DS, hf, env={}, gpus=None, accepted=accepted, transformers_version="5.24.0")
    warn = next(f for f in found if f.code == "unknown-training-args")
    assert "transformers 5.24.0 does not accept: overwrite_output_dir" in warn.title
    assert "transformers 4.x (removed in 5.0) accepts it" in warn.why
    _, clean = diagnose(DS, ARGS, env={}, gpus=None, accepted=accepted, transformers_version="5.24.0")
    assert "unknown-training-args" not in {f.code for f in clean}


def test_the_fixed_text_findings_are_whole_records() -> None:
    from tuner.interop.doctor_finding import FIXED_FILE, _fixed

    catalog = _fixed()
    assert set(catalog) == set(yaml.safe_load(FIXED_FILE.read_text()))
    for code, f in catalog.items():
        assert f.code == code and f.severity in ("warn", "info") and f.title and f.why and f.fix, code
        assert f.nbytes is None and f.number.startswith("no number"), code
        assert f.search or f.severity == "info", code


SEED_OOM = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.81 GiB. GPU has a total capacity of "
    "79.15 GiB of which 2.86 GiB is free. ... 74.19 GiB is allocated by PyTorch, and 1.59 GiB is reserved by "
    "PyTorch but unallocated."
)


def test_an_oom_message_qualifies_the_findings_it_speaks_to() -> None:
    from tuner.memory.oom_message import parse

    hf = {**ARGS, "per_device_eval_batch_size": 32, "predict_with_generate": True, "eval_strategy": "epoch"}
    b = basis(DS, hf)
    plain = {f.code: f for f in diagnose(DS, hf, env={}, gpus=2, basis=b)[1]}
    qualified = {f.code: f for f in diagnose(DS, hf, env={}, gpus=2, basis=b, oom=parse(SEED_OOM))[1]}
    assert not any(f.oom for f in plain.values()) and set(plain) == set(qualified)  # qualified, never dropped
    # 1.59 GiB reserved-unallocated + 2.86 GiB free < 4.81 GiB: the message rules fragmentation out
    for code in ("overlap-comm-buckets", "allocator-fragmentation"):
        assert qualified[code].oom.startswith("fragmentation ruled out"), code
    # the buckets' whole part is smaller than the failed allocation: not the one that failed
    assert qualified["overlap-comm-buckets"].nbytes < 4.81 * (1 << 30)
    assert "larger than this whole part" in qualified["overlap-comm-buckets"].oom
    evals = qualified["eval-batch-generate"].oom
    assert "at the end of the first epoch (eval_strategy: epoch): if your OOM came before then" in evals
    assert not qualified["gpus-without-launcher"].oom
    fits = parse(SEED_OOM.replace("2.86 GiB is free", "3.5 GiB is free"))  # 1.59 + 3.5 >= 4.81: possible
    again = {f.code: f for f in diagnose(DS, hf, env={}, gpus=2, basis=b, oom=fits)[1]}
    assert again["allocator-fragmentation"].oom.startswith("fragmentation possible")
