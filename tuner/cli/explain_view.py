"""`tuner explain`'s text (about 40 lines of 100 columns) and JSON, from the explanation record (pure)."""

from __future__ import annotations

import json

from tuner.cli.estimate_view import phase_json
from tuner.memory.breakdown import PARTS, PhaseEstimate
from tuner.memory.explain import Change, Explanation

GiB = 1 << 30
_SHORT = {
    "parameters": "params",
    "gradients": "grads",
    "optimizer states": "optim",
    "ZeRO buffers": "ZeRO",
    "activations + temporaries": "activ",
    "generation cache": "cache",
}


def _row(p: PhaseEstimate) -> str:
    cells = "".join(f"{p.part(name) / GiB:>8.2f}" for name in PARTS)
    return f"  {p.title:<25}{cells}{p.total / GiB:>9.2f}"


def _config(e: Explanation) -> str:
    k = e.config
    engine = k.engine if k.engine == "torch" else f"ZeRO-{k.zero_stage}"
    extra = [n for n, on in (("offload", k.offload_optimizer), ("checkpointing", k.gradient_checkpointing)) if on]
    return ", ".join([f"micro {k.micro_batch_size}", engine, *extra, k.precision])


def command(c: Change, search: str) -> str:
    """The command that probes the change: the job's search with the change's flags or space file."""
    if c.space is None:
        return f"{search} {c.flags}".strip()
    return f"printf '{c.space}\\n' > space.yaml && {search} {c.flags} --space space.yaml".replace("  ", " ")


def _oom(e: Explanation) -> list[str]:
    """The OOM message's facts read back, matched to the trace, and fragmentation ruled in or out."""
    if e.oom is None:
        return []
    out = [f"your OOM message: {', '.join(e.oom.lines())}"]
    if e.matches:
        out.append(f"  matched: {e.matches[0].describe()}")
        out += [f"  also this size: {m.describe()}" for m in e.matches[1:3]]
    else:
        out.append(
            "  matched: nothing in the trace reaches that size at a length your data has; "
            "the trace does not cover the CUDA context, NCCL buffers or the allocator's own blocks"
        )
    if e.fragmentation:
        out.append(f"  {e.fragmentation}")
    return out


def lines(e: Explanation, search: str) -> list[str]:
    out = [
        f"config: {_config(e)}; device memory {e.capacity / GiB:.2f} GiB a rank",
        f"worst batch: {e.worst.describe()} (your data's longest, padded to the longest in the batch)",
        "  peak by phase and part, GiB" + "".join(f"{_SHORT[n]:>8}" for n in PARTS) + f"{'total':>9}",
        *(_row(p) for p in e.breakdown.worst.phases),
    ]
    peak = e.breakdown.worst.phase(e.crossing) if e.crossing else e.breakdown.worst.peak
    for part in peak.parts:
        for a in part.largest:
            out.append(f"    largest in the {peak.title}: {a.describe()}")
    out.append(f"verdict: {e.verdict}")
    if e.eval_note:
        out.append(e.eval_note)
    if e.crash is not None:
        out.append(f"crash: your config on your data: {e.crash.describe()}")
    out += _oom(e)
    if e.changes:
        out.append("changes under which the worst batch's train step fits (with the margin), by predicted throughput:")
        for n, c in enumerate(e.changes, 1):
            out += [f"  {n}. {c.line()}", f"     {command(c, search)}"]
    elif e.crossing:
        out.append("no single change fits the worst batch; combine them (tuner search probes combinations)")
    if e.traced_lengths:
        out.append(
            f"estimate: traced at inputs of {', '.join(map(str, e.traced_lengths))} tokens; longer ones follow "
            "the fitted a*L + b*L^2 per sample (extrapolated)"
            + ("; eval phases traced at 1 sample a batch, scaled per sample" if e.config.eval_batch_size else "")
        )
    out.append(e.not_covered)
    return out


def as_json(e: Explanation) -> str:
    crash = e.crash
    body = {
        "config": e.config.model_dump(mode="json"),
        "capacity": e.capacity,
        "worst_batch": {
            "batch": e.worst.batch,
            "input_length": e.worst.input_length,
            "target_length": e.worst.target_length,
        },
        "ranks": [{"rank": r.rank, "phases": [phase_json(p) for p in r.phases]} for r in e.breakdown.ranks],
        "verdict": {"text": e.verdict, "phase": e.crossing},
        "eval": e.eval_note,
        "crash": None
        if crash is None
        else {
            "text": crash.describe(),
            "unfit_share": crash.unfit_share,
            "median_samples": crash.median_samples,
            "p90_samples": crash.p90_samples,
        },
        "oom_message": None if e.oom is None else e.oom.__dict__,
        "matches": [{**m.__dict__, "shape": list(m.shape), "error": m.error, "text": m.describe()} for m in e.matches],
        "fragmentation": e.fragmentation,
        "changes": [{**c.__dict__, "text": c.line()} for c in e.changes],
        "traced_lengths": list(e.traced_lengths),
        "not_covered": e.not_covered,
    }
    return json.dumps(body, indent=2)
