"""`tuner explain`'s text (about 40 lines of 100 columns) and JSON, from the explanation record (pure)."""

from __future__ import annotations

import json
import re

from tuner.cli.estimate_view import phase_json
from tuner.memory.breakdown import (
    ACTIVATIONS,
    PARTS,
    PHASE_TITLES,
    REFERENCE,
    PhaseEstimate,
    RankEstimate,
    columns,
)
from tuner.memory.explain import Change, Explanation, RecordedFailure, TrialFacts
from tuner.memory.oom_match import Landing
from tuner.memory.precision import traced_precision
from tuner.memory.reference import PAIRS_NOTE
from tuner.memory.snapshot_parts import SnapshotParts, SnapshotRead
from tuner.units import memory_text

GiB = 1 << 30
SHOWN_FAILURES = 2  # ranks whose recorded failure the text prints (the text stays about 40 lines); --json has all
_SHORT = {
    "parameters": "params",
    "reference model": "ref",
    "gradients": "grads",
    "optimizer states": "optim",
    "ZeRO buffers": "ZeRO",
    "gathered parameters": "gather",
    "activations + temporaries": "activ",
    "generation cache": "cache",
}


def _unit(capacity: int) -> tuple[str, int]:
    """The table's unit: GiB, MiB for a device under one GiB (a tiny model's numbers are not 0.04 GiB)."""
    return ("GiB", GiB) if capacity >= GiB else ("MiB", 1 << 20)


def _row(p: PhaseEstimate, names: tuple[str, ...] = PARTS, unit: int = GiB) -> str:
    cells = "".join(f"{p.part(name) / unit:>8.2f}" for name in names)
    return f"  {p.title:<25}{cells}{p.total / unit:>9.2f}"


def _dpo_shares(peak: PhaseEstimate, unit_name: str, unit: int) -> list[str]:
    """A DPO step's shares of the phase (tuner.memory.reference): its frozen reference model's column and the pairs'
    activations, with the parts' own notes. None for any other job."""
    notes = {part.name: part for part in peak.parts}
    ref, act = notes.get(REFERENCE), notes.get(ACTIVATIONS)
    pairs = act is not None and PAIRS_NOTE in act.note
    if (ref is None or not ref.nbytes) and not pairs:
        return []
    said = []
    if ref is not None and ref.nbytes:
        said.append(f"the reference model {ref.nbytes / unit:.2f} {unit_name} ({ref.note})")
    if pairs and act is not None:
        said.append(f"the pairs' activations {act.nbytes / unit:.2f} {unit_name} (2 x micro rows: chosen + rejected)")
    return [f"    DPO in the {peak.title}: " + "; ".join(said)]


def _config(e: Explanation) -> str:
    k = e.config
    engine = k.engine_label
    extra = [n for n, on in (("offload", k.offload_optimizer), ("checkpointing", k.gradient_checkpointing)) if on]
    return ", ".join([f"micro {k.micro_batch_size}", engine, *extra, k.precision])


def command(c: Change, search: str) -> str:
    """The command that probes the change: the job's search with the change's flags or space file (a change's
    --max-length replaces the job's)."""
    if "--max-length" in c.flags:
        search = re.sub(r" --max-length \S+", "", search)
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


def _size(n: int) -> str:
    return memory_text(n)


def _where(f: RecordedFailure) -> str:
    """The failure's phase and stage, as the rank recorded them."""
    phase = {"train": "the train step", "eval": "the eval forward", "generate": "the generate", "setup": "setup"}
    at = phase.get(f.failed.phase or "", "an unrecorded phase")
    return f"{at}'s {f.failed.stage}" if f.failed.stage and f.failed.phase == "train" else at


def _landing(w: Landing) -> str:
    title = PHASE_TITLES.get(w.phase, w.phase)
    if w.part is None:
        return (
            f"in use + asked = {_size(w.at)}, past the estimate's {title} ({_size(w.total)}): the estimate is low "
            f"by at least {_size(w.at - w.total)}"
        )
    return (
        f"in use + asked = {_size(w.at)} lands in the estimate's {w.part} of the {title} "
        f"(stacked in the order printed: {_size(w.start)} to {_size(w.end)} of {_size(w.total)})"
    )


def _snapshot(read: SnapshotRead, estimate: PhaseEstimate) -> list[str]:
    """The snapshot's live bytes per part beside the estimate's phase, the rest, and the largest unattributed sites."""
    s = read.parts
    if s is None:
        return [f"  memory snapshot not read: {read.error}"]
    out = [
        f"  snapshot: live memory by the frames that allocated it vs the estimate's {estimate.title}, GiB:",
        f"    {'(the estimate uncalibrated, as the table above)':<56}{'snapshot':>10}{'estimate':>10}",
    ]
    out += [
        f"    {name:<56}{s.part(name) / GiB:>10.2f}{estimate.part(name) / GiB:>10.2f}" for name in columns([estimate])
    ]
    rest = (
        ("before recording (no stack: setup, the model as built)", s.before_recording),
        ("unattributed (no rule matches its frames)", s.unattributed),
    )
    out += [f"    {name:<56}{n / GiB:>10.2f}{'-':>10}" for name, n in rest]
    if s.unframed:  # counted in the gradients above, by the recording's trace: no frames to read
        said = "of the gradients, recorded with no Python frames (the backward's thread)"
        out.append(f"    {said}: {s.unframed / GiB:.2f} GiB")
    cut = f"; cut at {s.blocks:,} blocks, the rest not summed" if s.cut else ""
    out.append(
        f"    live {s.live / GiB:.2f} GiB of {s.reserved / GiB:.2f} GiB reserved "
        f"(the estimate's phase {estimate.total / GiB:.2f} GiB){cut}"
    )
    out += [f"    unattributed: {c.frame}, {_size(c.nbytes)} in {c.blocks} block(s)" for c in s.unattributed_sites[:3]]
    return out


def _phase_of(f: RecordedFailure, rank: RankEstimate) -> PhaseEstimate:
    """The estimate's phase the failure is attributed to, else the peak phase."""
    names = {p.phase for p in rank.phases}
    return rank.phase(f.attribution.phase) if f.attribution.phase in names else rank.peak


def _failure(f: RecordedFailure, rank: RankEstimate) -> list[str]:
    a, failed = f.attribution, f.failed
    dims = " x ".join(f"{d:,}" for d in failed.shape)
    op = f" ({failed.op} {failed.dtype} {dims})" if failed.op else " (the op is in the memory snapshot's stacks)"
    cap = f" of {_size(failed.capacity)}" if failed.capacity else ""
    out = [
        f"recorded failure, rank {f.rank}: tried to allocate {_size(failed.nbytes)}{op} in {_where(f)}, "
        f"{_size(failed.live)} in use{cap}"
    ]
    part = f"the {a.part}" if a.part else "no part"
    phase = f" of the {PHASE_TITLES[a.phase]}" if a.phase else ""
    out.append(f"  attributed to {part}{phase}, by {a.how}")
    if a.traced is not None:
        out.append(f"  matched: {a.traced.describe()}")
    if a.landing is not None:
        out.append(f"  {_landing(a.landing)}")
    if f.snapshot:
        shown = f.snapshot if len(f.snapshot) <= 300 else f"{f.snapshot[:300]}..."  # a stored path, cut
        out.append(f"  memory snapshot: {shown} (drag it onto pytorch.org/memory_viz)")
    if f.snapshot_read is not None:
        out += _snapshot(f.snapshot_read, _phase_of(f, rank))
    return out


def _trial(t: TrialFacts, rank: RankEstimate) -> list[str]:
    out = [f"measured (trial {t.trial} of study {t.study}) against the estimate (parts uncalibrated):"]
    out += [f"  {c.describe()}" for c in t.checks]
    if not t.checks:
        out.append("  no phase completed its measurement (the probe ended before its memory window did)")
    calibrated = (
        f"the estimate's peak {_size(t.raw)}, calibrated on the study's {t.calibration_probes} other measured "
        f"probe(s): {_size(t.calibrated)}"
        if t.calibration_probes
        else f"the estimate's peak {_size(t.raw)} (no other measured probe of the study to calibrate on)"
    )
    if t.need is not None:
        out.append(f"  the most a rank needed: {_size(t.need)}; {calibrated}")
    elif t.oom_need is not None:
        out.append(f"  ran out: a rank needed at least {_size(t.oom_need)} (in use + refused); {calibrated}")
    else:
        out.append(f"  {calibrated}")
    for f in t.failures[:SHOWN_FAILURES]:
        out += _failure(f, rank)
    if len(t.failures) > SHOWN_FAILURES:
        ranks = ", ".join(str(f.rank) for f in t.failures[SHOWN_FAILURES:])
        out.append(f"  ranks {ranks} recorded theirs too (--json lists every rank's)")
    return out


def _shape(e: Explanation) -> str:
    """What the worst batch is: the probe's, the data's longest, or every sample at max_length (no data given)."""
    if e.trial is not None:
        return "the probe's: every sample at max_length"
    if e.with_data:
        return "your data's longest, padded to the longest in the batch"
    return "every sample at max_length: no --dataset given"


def lines(e: Explanation, search: str) -> list[str]:
    t = e.trial
    head = [] if t is None else [f"trial {t.trial} of study {t.study}: {t.status}" + (f" ({t.cause})" * bool(t.cause))]
    shape = _shape(e)
    names = columns(e.breakdown.worst.phases)
    unit_name, unit = _unit(e.capacity)
    out = [
        *head,
        f"config: {_config(e)}; device memory {memory_text(e.capacity)} a rank",
        f"worst batch: {e.worst.describe()} ({shape})",
        f"  peak by phase and part, {unit_name}" + "".join(f"{_SHORT[n]:>8}" for n in names) + f"{'total':>9}",
        *(_row(p, names, unit) for p in e.breakdown.worst.phases),
    ]
    peak = e.breakdown.worst.phase(e.crossing) if e.crossing else e.breakdown.worst.peak
    out += _dpo_shares(peak, unit_name, unit)
    for part in peak.parts:
        for a in part.largest:
            out.append(f"    largest in the {peak.title}: {a.describe()}")
    out.append(f"verdict: {e.verdict}")
    if e.eval_note:
        out.append(e.eval_note)
    if t is not None:
        out += _trial(t, e.breakdown.worst)
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
    out.append(traced_precision(e.config).line())
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
        "precision_traced": traced_precision(e.config).line(),
        "not_covered": e.not_covered,
        "trial": None if e.trial is None else _trial_json(e.trial, e.breakdown.worst),
    }
    return json.dumps(body, indent=2)


def _snapshot_json(s: SnapshotParts) -> dict[str, object]:
    return {
        "parts": dict(s.parts),
        "before_recording": s.before_recording,
        "unattributed": s.unattributed,
        "unattributed_sites": [c.__dict__ for c in s.unattributed_sites],
        "live": s.live,
        "reserved": s.reserved,
        "blocks": s.blocks,
        "cut": s.cut,
        "unframed": s.unframed,
    }


def _snapshot_read_json(f: RecordedFailure, rank: RankEstimate) -> dict[str, object] | None:
    read = f.snapshot_read
    if read is None:
        return None
    phase = _phase_of(f, rank)
    return {
        "path": read.path,
        "error": read.error,
        "attributed": None if read.parts is None else _snapshot_json(read.parts),
        "estimate": {"phase": phase.phase, "parts": {p: phase.part(p) for p in PARTS}, "total": phase.total},
    }


def _trial_json(t: TrialFacts, rank: RankEstimate) -> dict[str, object]:
    return {
        "study": t.study,
        "trial": t.trial,
        "status": t.status,
        "cause": t.cause,
        "measured": [
            {"phase": c.phase, "measured": c.measured, "estimate": phase_json(c.estimate), "error": c.error}
            for c in t.checks
        ],
        "need": t.need,
        "oom_need": t.oom_need,
        "estimate_raw": t.raw,
        "estimate_calibrated": t.calibrated,
        "calibration_probes": t.calibration_probes,
        "failures": [
            {
                "rank": f.rank,
                "failed": f.failed.model_dump(mode="json"),
                "phase": f.attribution.phase,
                "part": f.attribution.part,
                "how": f.attribution.how,
                "matched": None if f.attribution.traced is None else f.attribution.traced.describe(),
                "landing": None if f.attribution.landing is None else f.attribution.landing.__dict__,
                "snapshot": f.snapshot,
                "snapshot_parts": _snapshot_read_json(f, rank),
            }
            for f in t.failures
        ],
        "snapshots": list(t.snapshots),
    }
