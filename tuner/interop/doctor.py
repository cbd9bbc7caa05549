"""`tuner doctor`: reads an existing DeepSpeed config / training-args pair (and the cheap parts of the environment)
and reports the known OOM and slowdown traps, each with what to try, the space knob `tuner search` would probe and,
given the model (a :class:`~tuner.interop.doctor_cost.Basis`), the bytes at stake from the one estimate (the part
`tuner estimate` prints); findings are ranked by those bytes, largest first.

Pure code over dicts; the environment, the GPU count and the estimator come in as arguments (the CLI reads them) so
every check is testable without a GPU. No torch import.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from trials.contract import BUCKET_KNOBS, DS_DEFAULT_BUCKET
from tuner.interop.baseline import Baseline, parse_baseline
from tuner.interop.doctor_cost import Basis, Cost, bucket_cost, eval_batch_cost
from tuner.interop.doctor_env import env_traps, visible_gpus
from tuner.interop.doctor_finding import Finding, fixed, rank, when
from tuner.interop.doctor_oom import qualify
from tuner.interop.doctor_trainer import ScheduleCheck, trainer_findings
from tuner.interop.doctor_trl import trl_findings
from tuner.interop.export.mapping import auto_paths, get_path
from tuner.job.definition import HF_MAX_LENGTH_KEYS
from tuner.job.ledger.trl import recipe_fields
from tuner.memory.oom_message import OomMessage

__all__ = ["Basis", "Finding", "diagnose", "eval_first_runs", "visible_gpus"]

LARGE_BUCKET = 100_000_000
SMALL_BUCKET = 50_000_000  # what the bucket finding suggests
EVAL_RATIO = 2  # an eval batch at least this many times the train micro batch, with generate, is flagged
NEEDS_MODEL = "no number without --model: the estimate needs the model's parameters"


def _sci(n: float) -> str:
    mantissa, exponent = f"{n:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _priced(finding: Finding, cost: Cost | None, basis: Basis | None) -> Finding:
    """The finding with its number from the estimate (``cost``), or with why it has none."""
    if cost is not None:
        return replace(finding, nbytes=cost.nbytes, number=cost.number, not_covered=cost.not_covered)
    missing = NEEDS_MODEL if basis is None else "no number: the estimate's trace has no such phase"
    return replace(finding, number=missing)


def _zero_traps(ds: Mapping[str, Any], basis: Basis | None) -> list[Finding]:
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
    found = Finding(
        code="overlap-comm-buckets",
        severity="warn",
        title=f"overlap_comm with {_sci(bucket)}-element buckets under ZeRO-{stage} CPU offload",
        why="overlap_comm keeps a second reduce bucket in flight next to the all-gather bucket, each of the "
        "configured size whatever the model's, allocated in pieces during backward, so the cache fragments and "
        "one rank can run out while the others look half empty",
        fix=f"set reduce_bucket_size and allgather_bucket_size to {_sci(SMALL_BUCKET)}, or overlap_comm false "
        "(offload already hides most communication behind the CPU optimizer step)",
        search="overlap_comm: [false, true]\nreduce_bucket_size: [50000000, 200000000]\n"
        "allgather_bucket_size: [50000000, 200000000]",
    )
    cost = None
    if basis is not None:
        small = {k: SMALL_BUCKET for k in BUCKET_KNOBS}
        cost = bucket_cost(basis, basis.knobs.model_copy(update=small), f"{_sci(SMALL_BUCKET)} buckets")
    return [_priced(found, cost, basis)]


def eval_first_runs(hf: Mapping[str, Any]) -> str:
    """When the Trainer first evaluates, from eval_strategy / eval_steps, in words."""
    strategy = str(hf.get("eval_strategy") or hf.get("evaluation_strategy") or "no")
    if strategy == "epoch":
        return "at the end of the first epoch (eval_strategy: epoch)"
    if strategy == "steps":
        steps = hf.get("eval_steps") or hf.get("logging_steps") or 500
        return f"after step {steps} (eval_strategy: steps)"
    return f"only when called (eval_strategy: {strategy})"


def _eval_when(hf: Mapping[str, Any]) -> str:
    """When evaluation first runs, as a qualification of a finding about it: an OOM before then is not it."""
    first = eval_first_runs(hf)
    if first.startswith("only when called"):
        return f"evaluation runs {first}"
    return f"evaluation first runs {first}: an OOM before then is not it"


def _eval_batch(hf: Mapping[str, Any], micro: int | None, basis: Basis | None) -> list[Finding]:
    eval_bs = hf.get("per_device_eval_batch_size", 8)
    if hf.get("predict_with_generate") is not True or not micro or not isinstance(eval_bs, int):
        return []
    if eval_bs < EVAL_RATIO * micro:
        return []
    found = Finding(
        code="eval-batch-generate",
        severity="warn",
        title=f"eval batch {eval_bs} is {eval_bs / micro:.0f}x the train micro batch {micro}, "
        "with predict_with_generate",
        why="evaluation runs while the optimizer state and ZeRO buffers stay resident; generate holds a key/value "
        f"cache per sequence and beam for the whole eval batch; {_eval_when(hf)}",
        fix=f"per_device_eval_batch_size <= {micro} (or a short generation_max_length / fewer beams)",
        search=f"eval_batch_size: [{micro}, {max(micro, eval_bs // 2)}, {eval_bs}]\ngenerate: [true]",
    )
    cost = eval_batch_cost(basis, micro, eval_first_runs(hf)) if basis is not None else None
    return [_priced(found, cost, basis)]


def _hf_traps(hf: Mapping[str, Any], micro: int | None, basis: Basis | None) -> list[Finding]:
    found = _eval_batch(hf, micro, basis)
    generate = hf.get("predict_with_generate") is True
    evaluates = generate or hf.get("do_eval") is True or hf.get("eval_strategy", "no") not in ("no", None)
    # with predict_with_generate the loop keeps generated token ids (batch x generation length), not logits
    if evaluates and not generate and hf.get("eval_accumulation_steps") is None:
        found.append(
            Finding(
                code="eval-accumulation",
                severity="warn",
                title="eval predictions accumulate on the GPU for the whole eval set (eval_accumulation_steps unset)",
                why="the Trainer keeps every eval batch's logits on the device until the end of the "
                "evaluation loop, so memory grows with the number of eval samples: an OOM after some hundreds; "
                f"{_eval_when(hf)}",
                fix="eval_accumulation_steps: 8 (moves predictions to the CPU every 8 steps)",
                search="not a tuner knob: set it in the training args; the search then probes the eval step with "
                "eval_batch_size/generate",
                number="no number: the estimate covers one eval batch, not the logits the loop gathers",
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
                number="no number: the bytes follow your longest sample; `tuner explain --dataset` estimates the "
                "train step at it and the length that fits",
            )
        )
    return found + when(hf.get("logging_steps") == 1, fixed("logging-every-step"))


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
            number="no number: the run fails before training",
        )
    ]


def _ledger_refusals(baseline: Baseline | None, accepted: frozenset[str] | None) -> list[Finding]:
    """The keys or values of the training args a probe refuses (tuner.job.ledger), each as its one line; the keys this
    host's TrainingArguments does not take are ``_unknown_keys``' finding already when ``accepted`` is known."""
    if baseline is None:
        return []
    lines = [line for key, line in baseline.refused.items() if accepted is None or key in accepted]
    if not lines:
        return []
    return [
        Finding(
            code="training-args-refused",
            severity="warn",
            title=f"{len(lines)} training-args field(s) a probe cannot run as your Trainer runs them",
            why="; ".join(lines),
            fix="change or drop each as its line says; tuner search refuses these files until then",
            search="tuner search --baseline ... refuses them in one line, before any probe",
            number="no number: not probed",
        )
    ]


def diagnose(
    ds_config: Mapping[str, Any] | None,
    hf_args: Mapping[str, Any] | None,
    *,
    env: Mapping[str, str] | None = None,
    gpus: int | None = None,
    accepted: frozenset[str] | None = None,
    transformers_version: str | None = None,
    basis: Basis | None = None,
    oom: OomMessage | None = None,
    trainer: str | None = None,
    schedule: ScheduleCheck | None = None,
) -> tuple[Baseline | None, list[Finding]]:
    """The parsed setup (None when "auto" values have no training args to resolve them) and its findings, ranked
    (:func:`~tuner.interop.doctor_finding.rank`: the largest number first). A broken config (contradictory batch
    fields, unknown ZeRO keys ...) raises BaselineError. ``accepted``: the field names this host's TrainingArguments
    takes (``transformers_version`` its release), to flag the others. ``basis``: the estimate of this setup (the
    model traced), which gives the findings their bytes; without it they have none and a note says so. ``oom``: the
    user's OOM message, which qualifies the findings (:func:`tuner.interop.doctor_oom.qualify`). ``trainer``: the
    transformers release the user trains with (None: ``transformers_version``, else this host's): "auto" is filled
    as its Trainer fills it, and ``schedule`` (DeepSpeed's verdict on a DeepSpeed JSON's scheduler) judges the
    result (tuner.interop.doctor_trainer)."""
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
                number="no number: not checked",
            )
        )
    else:
        # max_length=1 only lets a setup without a length parse; the no-truncation check reads the args themselves
        release = trainer or transformers_version
        baseline = parse_baseline(ds or None, hf_args, max_length=1, transformers_version=release, strict=False)
    micro = baseline.knobs["micro_batch_size"] if baseline else hf.get("per_device_train_batch_size")
    findings += trainer_findings(baseline, schedule)
    findings += _zero_traps(ds, basis)
    findings += when(
        ds.get("steps_per_print") == 1 or ds.get("wall_clock_breakdown") is True, fixed("deepspeed-logging")
    )
    if hf_args is not None:
        accepted = accepted | recipe_fields(hf) if accepted is not None else None  # a TRL recipe's own keys
        findings += _unknown_keys(hf, accepted, transformers_version)
        findings += _ledger_refusals(baseline, accepted)
        findings += _hf_traps(hf, micro if isinstance(micro, int) else None, basis)
        findings += trl_findings(hf, basis)  # a TRL recipe's own traps
    else:
        findings.append(fixed("no-training-args"))
    findings += env_traps(env, gpus)
    findings += when(basis is None, fixed("skipped-numbers"))
    if oom is not None:
        findings = qualify(findings, oom, eval_first_runs(hf))
    return baseline, rank(findings)
