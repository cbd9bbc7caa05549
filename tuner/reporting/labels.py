"""Short labels of a probe's config, as the CLI's tables and stream and the report's figures name probes: the knobs
that differ from the defaults and from the job ("micro=4 z2 reduce=2e8 overlap"), and a probe's name in a figure
("t12 micro=4 z2", "confirm micro=4 z2"). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tuner.memory.frontier import describe
from tuner.records import Fidelity, ProbeRow


def compact(knobs: Mapping[str, Any], job: Mapping[str, Any] | None = None) -> str:
    """A config's label for a row: the knobs that differ from the defaults and from the job (held fixed, shown once
    above the table), large numbers as 2e8, equal allgather and reduce buckets as one buckets=."""
    fixed = {k: v for k, v in (job or {}).items() if k in ("precision", "max_length", "eval_batch_size", "generate")}
    shown = {k: v for k, v in knobs.items() if k not in fixed or str(fixed[k]) != str(v)}  # str: parsed labels
    parts = []
    for part in describe(shown).split():
        name, _, value = part.partition("=")
        if value == "None":
            continue
        if value.isdigit() and len(value) > 5:  # 200000000 -> 2e8
            value = f"{int(value):.3g}".replace("e+0", "e").replace("e+", "e")
        short = _SHORT.get(name, name)
        if value == "True" and name in _FLAGS:
            parts.append(short)
        elif value == "False" and name in _FLAGS:
            parts.append(f"no-{short}")
        else:
            parts.append(value if name == "engine" else f"{short}{'' if name == 'zero_stage' else '='}{value}")
    return " ".join(_merge_buckets(parts))


def _merge_buckets(parts: list[str]) -> list[str]:
    """allgather=1e7 reduce=1e7 -> buckets=1e7 (one value for both, as DeepSpeed's docs size them together)."""
    gather = next((p for p in parts if p.startswith("allgather=")), None)
    reduce = next((p for p in parts if p.startswith("reduce=")), None)
    if gather is None or reduce is None or gather.partition("=")[2] != reduce.partition("=")[2]:
        return parts
    return [f"buckets={reduce.partition('=')[2]}" if p == reduce else p for p in parts if p != gather]


_SHORT = {
    "zero_stage": "z",
    "allgather_bucket_size": "allgather",
    "reduce_bucket_size": "reduce",
    "overlap_comm": "overlap",
    "contiguous_gradients": "contiguous",
    "offload_optimizer": "offload",
    "gradient_checkpointing": "ckpt",
    "eval_batch_size": "eval",
    "reshard_after_forward": "reshard",
    "offload_params": "offload-params",
    "offload_param": "offload-params",
}
_FLAGS = (
    "overlap_comm",
    "contiguous_gradients",
    "offload_optimizer",
    "gradient_checkpointing",
    "generate",
    "reshard_after_forward",
    "offload_params",
    "offload_param",
)


def probe_label(row: ProbeRow, job: Mapping[str, Any] | None = None) -> str:
    """A probe's name in a figure or table: its trial and config ("t12 micro=4 z2"), a confirm or baseline probe's
    kind in place of a missing trial number ("confirm micro=4 z2"), never "tNone"."""
    config = compact(row.knobs or {}, job) or "-"
    if row.trial_number is None:
        return f"{row.fidelity.value} {config}"
    kind = "" if row.fidelity in (Fidelity.SHORT, Fidelity.INFERRED) else f" {row.fidelity.value}"
    return f"t{row.trial_number}{kind} {config}"


__all__ = ["compact", "probe_label"]
