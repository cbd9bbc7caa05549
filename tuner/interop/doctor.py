"""`tuner doctor`: reads an existing DeepSpeed config / training-args pair (and the cheap parts of the environment)
and reports the known OOM and slowdown traps, each with what to try and the space knob `tuner search` would probe.

Pure code over dicts; the environment and the GPU count come in as arguments (the CLI reads them) so every check
is testable without a GPU. No torch import.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from trials.contract import BUCKET_KNOBS, DS_DEFAULT_BUCKET
from tuner.interop.baseline import Baseline, parse_baseline
from tuner.interop.export.mapping import auto_paths, get_path
from tuner.job.definition import HF_MAX_LENGTH_KEYS

Severity = Literal["warn", "info"]
LAUNCHER_ENV = ("WORLD_SIZE", "LOCAL_RANK", "RANK")
# DeepSpeed docs (ZeRO config, overlap_comm): "comes at the cost of using 4.5x the allgather_bucket_size and
# reduce_bucket_size values"; with 2e8-element buckets that is ~1.7 GiB in 16-bit and ~3.4 GiB in fp32 per GPU.
OVERLAP_FACTOR = 4.5
LARGE_BUCKET = 100_000_000
EVAL_RATIO = 2  # an eval batch at least this many times the train micro batch, with generate, is flagged


@dataclass(frozen=True)
class Finding:
    code: str
    severity: Severity
    title: str
    why: str
    fix: str  # what to try by hand
    search: str  # how `tuner search` tests it: the space lines to add (knob names of trials.contract.Knobs)

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def visible_gpus(env: Mapping[str, str], root: Path = Path("/")) -> int | None:
    """GPUs this process would see: CUDA_VISIBLE_DEVICES when set, else the NVIDIA driver's device list; None when
    nothing says (no driver). Reads files only: importing torch to count would cost seconds."""
    if "CUDA_VISIBLE_DEVICES" in env:
        ids = [x for x in env["CUDA_VISIBLE_DEVICES"].split(",") if x.strip()]
        return 0 if ids and ids[0].strip().startswith("-") else len(ids)
    gpus = root / "proc" / "driver" / "nvidia" / "gpus"
    if gpus.is_dir():
        return sum(1 for _ in gpus.iterdir())
    devices = [p for p in (root / "dev").glob("nvidia[0-9]*") if p.name[6:].isdigit()]
    return len(devices) if devices else None


def _sci(n: float) -> str:
    mantissa, exponent = f"{n:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def _zero_traps(ds: Mapping[str, Any], precision: str | None) -> list[Finding]:
    zero = ds.get("zero_optimization") or {}
    stage = zero.get("stage", 0)
    offload = get_path(zero, ("offload_optimizer", "device")) in ("cpu", "nvme") or bool(zero.get("cpu_offload"))
    overlap = zero.get("overlap_comm", stage == 3)
    if stage not in (1, 2) or not offload or overlap is not True:
        return []
    sizes = [zero.get(k, DS_DEFAULT_BUCKET) for k in BUCKET_KNOBS]
    sizes = [s for s in sizes if isinstance(s, (int, float)) and not isinstance(s, bool)]
    bucket = max(sizes, default=DS_DEFAULT_BUCKET)
    if bucket < LARGE_BUCKET:
        return []
    elem = 4 if precision == "fp32" else 2
    extra = OVERLAP_FACTOR * bucket * elem
    return [
        Finding(
            code="overlap-comm-buckets",
            severity="warn",
            title=f"overlap_comm with {_sci(bucket)}-element buckets under ZeRO-{stage} CPU offload",
            why=(
                f"overlap_comm keeps ~{OVERLAP_FACTOR}x the bucket sizes in flight: about {_gib(extra)} per GPU on "
                "top of the model states, allocated in pieces during backward, so the cache fragments and one "
                "rank can run out while the others look half empty"
            ),
            fix="set reduce_bucket_size and allgather_bucket_size to 5e7, or overlap_comm false (offload already "
            "hides most communication behind the CPU optimizer step)",
            search="overlap_comm: [false, true]\nreduce_bucket_size: [50000000, 200000000]\n"
            "allgather_bucket_size: [50000000, 200000000]",
        )
    ]


def eval_first_runs(hf: Mapping[str, Any]) -> str:
    """When the Trainer first evaluates, from eval_strategy / eval_steps, in words."""
    strategy = str(hf.get("eval_strategy") or hf.get("evaluation_strategy") or "no")
    if strategy == "epoch":
        return (
            "evaluation first runs at the end of the first epoch (eval_strategy: epoch): an OOM before then is not it"
        )
    if strategy == "steps":
        steps = hf.get("eval_steps") or hf.get("logging_steps") or 500
        return f"evaluation first runs after step {steps} (eval_strategy: steps): an OOM before then is not it"
    return f"evaluation runs only when called (eval_strategy: {strategy})"


def _hf_traps(hf: Mapping[str, Any], micro: int | None) -> list[Finding]:
    found: list[Finding] = []
    generate = hf.get("predict_with_generate") is True
    evaluates = generate or hf.get("do_eval") is True or hf.get("eval_strategy", "no") not in ("no", None)
    when = eval_first_runs(hf)
    eval_bs = hf.get("per_device_eval_batch_size", 8)
    if generate and micro and isinstance(eval_bs, int) and eval_bs >= EVAL_RATIO * micro:
        found.append(
            Finding(
                code="eval-batch-generate",
                severity="warn",
                title=f"eval batch {eval_bs} is {eval_bs / micro:.0f}x the train micro batch {micro}, "
                "with predict_with_generate",
                why="evaluation runs while the optimizer state and ZeRO buffers stay resident; generate holds a "
                "key/value cache per sequence and beam for the whole eval batch, so the eval step, not training, is "
                f"the peak; {when}",
                fix=f"per_device_eval_batch_size <= {micro} (or a short generation_max_length / fewer beams)",
                search=f"eval_batch_size: [{micro}, {max(micro, eval_bs // 2)}, {eval_bs}]\ngenerate: [true]",
            )
        )
    # with predict_with_generate the loop keeps generated token ids (batch x generation length), not logits
    if evaluates and not generate and hf.get("eval_accumulation_steps") is None:
        found.append(
            Finding(
                code="eval-accumulation",
                severity="warn",
                title="eval predictions accumulate on the GPU for the whole eval set (eval_accumulation_steps unset)",
                why="the Trainer keeps every eval batch's logits on the device until the end of the "
                f"evaluation loop, so memory grows with the number of eval samples: an OOM after some hundreds; {when}",
                fix="eval_accumulation_steps: 8 (moves predictions to the CPU every 8 steps)",
                search="not a tuner knob: set it in the training args; the search then probes the eval step with "
                "eval_batch_size/generate",
            )
        )
    if not any(hf.get(k) for k in HF_MAX_LENGTH_KEYS):
        found.append(
            Finding(
                code="no-truncation",
                severity="warn",
                title="no max length: samples are not truncated",
                why="without truncation the batch shape follows the longest sample, so a rare long one (or a long "
                "target with generate) sets the peak long after training started",
                fix="tokenize with truncation=True and max_length (max_source_length / max_target_length in the "
                "example scripts); pad to it so every step has the same shape",
                search="max_length: [256, 512, 1024]   (the objective counts retained tokens, so truncating your data "
                "away never wins; pass --lengths with your length distribution)",
            )
        )
    if hf.get("logging_steps") == 1:
        found.append(
            Finding(
                code="logging-every-step",
                severity="warn",
                title="logging_steps=1: the Trainer logs every step",
                why="each log syncs the device (loss.item()) and, under DeepSpeed, writes through every rank: slower "
                "steps, and a measured throughput that is not the one of a real run",
                fix="logging_steps: 50 or more",
                search="nothing to add: probes measure without per-step logging",
            )
        )
    return found


#: training-args keys a transformers release dropped: the key -> the last release line that accepts it
REMOVED_KEYS = {"overwrite_output_dir": "4.x (removed in 5.0)"}


def _unknown_keys(hf: Mapping[str, Any], accepted: frozenset[str] | None, version: str | None) -> list[Finding]:
    """Keys of the training args this host's TrainingArguments does not take (``accepted``: its field names)."""
    if accepted is None:
        return []
    unknown = sorted(k for k in hf if k not in accepted and k != "deepspeed")
    if not unknown:
        return []
    known = [f"{k}: transformers {REMOVED_KEYS[k]} accepts it" for k in unknown if k in REMOVED_KEYS]
    return [
        Finding(
            code="unknown-training-args",
            severity="warn",
            title=f"training args this host's transformers {version or ''} does not accept: {', '.join(unknown)}",
            why="Seq2SeqTrainingArguments(**args) raises on them here"
            + (f" ({'; '.join(known)})" if known else "")
            + "; the run fails before training, or runs under another transformers than this host's",
            fix=f"drop {', '.join(unknown)} from the args, or run on the transformers that accepts them",
            search="nothing to add: probes build the args this host's transformers takes",
        )
    ]


def _skipped(gpus: int | None) -> list[Finding]:
    if gpus:
        return []
    return [
        Finding(
            code="skipped-gpu-checks",
            severity="info",
            title="skipped: the launcher and allocator checks (no GPUs visible on this host)",
            why="both read the GPUs the job would see; run tuner doctor where the job runs to have them",
            fix="run tuner doctor on the training host, from the same job script",
            search="",
        )
    ]


def _env_traps(env: Mapping[str, str], gpus: int | None) -> list[Finding]:
    found: list[Finding] = _skipped(gpus)
    if gpus and gpus > 1 and not any(env.get(k) for k in LAUNCHER_ENV):
        found.append(
            Finding(
                code="gpus-without-launcher",
                severity="warn",
                title=f"{gpus} GPUs visible and no launcher environment (WORLD_SIZE/LOCAL_RANK unset)",
                why="started as `python train.py`, the HF Trainer wraps the model in torch.nn.DataParallel: GPU 0 "
                "holds the optimizer and gathers every output, so it fills up while total GPU use stays low",
                fix=f"launch one process per GPU: `deepspeed --num_gpus {gpus} train.py`, `torchrun --nproc_per_node "
                f"{gpus} train.py` or `accelerate launch`; run `tuner doctor` from the same job script to check",
                search=f"tuner search --world-size {gpus} probes with one process per GPU under the DeepSpeed launcher",
            )
        )
    alloc = env.get("PYTORCH_CUDA_ALLOC_CONF") or env.get("PYTORCH_ALLOC_CONF") or ""
    if gpus and "expandable_segments:True" not in alloc:
        found.append(
            Finding(
                code="allocator-fragmentation",
                severity="info",
                title="the CUDA caching allocator runs without expandable_segments",
                why="memory reserved but unused in fragmented blocks counts against the GPU; an OOM message whose "
                "'reserved but unallocated' is large is this",
                fix="export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                search="alloc_conf: [null, 'expandable_segments:True']",
            )
        )
    return found


def _ds_logging(ds: Mapping[str, Any]) -> list[Finding]:
    if ds.get("steps_per_print") == 1 or ds.get("wall_clock_breakdown") is True:
        return [
            Finding(
                code="deepspeed-logging",
                severity="warn",
                title="DeepSpeed prints every step (steps_per_print=1 or wall_clock_breakdown)",
                why="per-step timers synchronise the device and print from every rank",
                fix="steps_per_print: 1000 and wall_clock_breakdown: false",
                search="nothing to add: probes run without DeepSpeed's step logging",
            )
        ]
    return []


def diagnose(
    ds_config: Mapping[str, Any] | None,
    hf_args: Mapping[str, Any] | None,
    *,
    env: Mapping[str, str] | None = None,
    gpus: int | None = None,
    accepted: frozenset[str] | None = None,
    transformers_version: str | None = None,
) -> tuple[Baseline | None, list[Finding]]:
    """The parsed setup (None when "auto" values have no training args to resolve them) and its findings, warnings
    first. A broken config (contradictory batch fields, unknown ZeRO keys ...) raises BaselineError. ``accepted``:
    the field names this host's TrainingArguments takes (``transformers_version`` its release), to flag the others."""
    env = dict(os.environ if env is None else env)
    ds = dict(ds_config or {})
    hf = dict(hf_args or {})
    if not ds and isinstance(hf.get("deepspeed"), Mapping):
        ds = dict(hf["deepspeed"])
    findings: list[Finding] = []
    baseline: Baseline | None = None
    if hf_args is None and auto_paths(ds):
        findings.append(
            Finding(
                code="auto-needs-training-args",
                severity="info",
                title=f"'auto' values ({', '.join(auto_paths(ds)[:4])}...) need the training args to check the batch",
                why="the HF Trainer fills them from its arguments at run time",
                fix="run tuner doctor --ds-config FILE --training-args ARGS.json",
                search="tuner search --baseline FILE (with the training args) probes your setup as trial 0",
            )
        )
    else:
        # max_length=1 only lets a setup without a length parse; the no-truncation check reads the args themselves
        baseline = parse_baseline(ds or None, hf_args, max_length=1)
    precision = baseline.knobs["precision"] if baseline else None
    micro = baseline.knobs["micro_batch_size"] if baseline else hf.get("per_device_train_batch_size")
    findings += _zero_traps(ds, precision)
    findings += _ds_logging(ds)
    if hf_args is not None:
        findings += _unknown_keys(hf, accepted, transformers_version)
        findings += _hf_traps(hf, micro if isinstance(micro, int) else None)
    else:
        findings.append(
            Finding(
                code="no-training-args",
                severity="info",
                title="no training args given: eval batch, generate, truncation and logging not checked",
                why="those traps live in the TrainingArguments, not in the DeepSpeed JSON",
                fix="pass --training-args with the JSON of your TrainingArguments (TrainingArguments.to_json_string())",
                search="",
            )
        )
    findings += _env_traps(env, gpus)
    findings.sort(key=lambda f: f.severity != "warn")
    return baseline, findings
