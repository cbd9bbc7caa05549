"""`tuner doctor --oom-message`: what the user's PyTorch OOM text says about each finding (pure). The message's facts
come from :mod:`tuner.memory.oom_message` (the reader `tuner explain` uses); a finding is qualified, never dropped:
fragmentation ruled in or out where the finding rests on it, a failed allocation larger than the finding's whole
part, and an eval finding's cause only if the OOM came once evaluation had run."""

from __future__ import annotations

from dataclasses import replace

from tuner.interop.doctor_cost import size
from tuner.interop.doctor_finding import Finding
from tuner.memory.oom_message import OomMessage, fragmentation

#: findings whose harm is fragmentation of the caching allocator
FRAGMENTING = ("overlap-comm-buckets", "allocator-fragmentation")
#: findings about the evaluation loop
EVALUATING = ("eval-batch-generate", "eval-accumulation")


def qualify(findings: list[Finding], oom: OomMessage, eval_first: str) -> list[Finding]:
    """Each finding with what ``oom`` says about it (``eval_first``: when evaluation first runs, in words)."""
    return [replace(f, oom=_about(f, oom, eval_first)) for f in findings]


def _about(f: Finding, oom: OomMessage, eval_first: str) -> str:
    said = []
    if f.code in FRAGMENTING:
        said.append(fragmentation(oom)[1])
    if f.nbytes is not None and f.nbytes < oom.failed:
        said.append(
            f"the failed allocation ({size(oom.failed)}) is larger than this whole part ({size(f.nbytes)}): not "
            "the allocation that failed, though its bytes count towards the total"
        )
    if f.code in EVALUATING:
        said.append(
            f"evaluation first runs {eval_first}: if your OOM came before then, this is not its cause (`tuner "
            "explain --dataset ... --oom-message` says when the config crashes on your data)"
        )
    return "; ".join(said)
