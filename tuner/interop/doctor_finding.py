"""One `tuner doctor` finding (a typed record), the order findings are told in, and the texts of the findings that
need no values from the setup."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, Literal

Severity = Literal["warn", "info"]


@dataclass(frozen=True)
class Finding:
    code: str
    severity: Severity
    title: str
    why: str
    fix: str  # what to try by hand
    search: str  # how `tuner search` tests it: the space lines to add (knob names of trials.contract.Knobs)
    nbytes: int | None = None  # the bytes at stake on one rank, from the one estimate: what findings are ranked by
    number: str = ""  # that number in words (the estimate's part, its phase, what the fix leaves), or why none
    not_covered: str = ""  # what the number does not cover (besides the estimate's own NOT_COVERED)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def rank(findings: Iterable[Finding]) -> list[Finding]:
    """Largest number first; the findings without one after them, warnings before notes; otherwise as found."""
    return sorted(findings, key=lambda f: (f.nbytes is None, -(f.nbytes or 0), f.severity != "warn"))


def when(condition: bool, finding: Finding) -> list[Finding]:
    """``[finding]`` when ``condition`` holds, else none: the shape of every check with fixed texts."""
    return [finding] if condition else []


NOT_MEMORY = "no number: a slowdown, not memory"

SKIPPED_GPU_CHECKS = Finding(
    code="skipped-gpu-checks",
    severity="info",
    title="skipped: the launcher and allocator checks (no GPUs visible on this host)",
    why="both read the GPUs the job would see; run tuner doctor where the job runs to have them",
    fix="run tuner doctor on the training host, from the same job script",
    search="",
    number="no number: not checked",
)
SKIPPED_NUMBERS = Finding(
    code="skipped-numbers",
    severity="info",
    title="skipped: the bytes behind each finding (no --model given)",
    why="the numbers are the estimate's parts (`tuner estimate`), which need the model's parameters and a trace",
    fix="run tuner doctor --model MODEL --world-size N with the same files (the trace tuner estimate runs: seconds "
    "for a small model, minutes for a large one on CPU)",
    search="",
    number="no number: not estimated",
)
DEEPSPEED_LOGGING = Finding(
    code="deepspeed-logging",
    severity="warn",
    title="DeepSpeed prints every step (steps_per_print=1 or wall_clock_breakdown)",
    why="per-step timers synchronise the device and print from every rank",
    fix="steps_per_print: 1000 and wall_clock_breakdown: false",
    search="nothing to add: probes run without DeepSpeed's step logging",
    number=NOT_MEMORY,
)
LOGGING_EVERY_STEP = Finding(
    code="logging-every-step",
    severity="warn",
    title="logging_steps=1: the Trainer logs every step",
    why="each log syncs the device (loss.item()) and, under DeepSpeed, writes through every rank: slower steps, and "
    "a measured throughput that is not the one of a real run",
    fix="logging_steps: 50 or more",
    search="nothing to add: probes measure without per-step logging",
    number=NOT_MEMORY,
)
NO_TRAINING_ARGS = Finding(
    code="no-training-args",
    severity="info",
    title="no training args given: eval batch, generate, truncation and logging not checked",
    why="those traps live in the TrainingArguments, not in the DeepSpeed JSON",
    fix="pass --training-args with the JSON of your TrainingArguments (TrainingArguments.to_json_string())",
    search="",
    number="no number: not checked",
)
ALLOCATOR_FRAGMENTATION = Finding(
    code="allocator-fragmentation",
    severity="info",
    title="the CUDA caching allocator runs without expandable_segments",
    why="memory reserved but unused in fragmented blocks counts against the GPU; an OOM message whose 'reserved but "
    "unallocated' is large is this (`tuner explain --oom-message` reads it)",
    fix="export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
    search="alloc_conf: [null, 'expandable_segments:True']",
    number="no number: fragmentation is outside the estimate; the OOM message's reserved-but-unallocated is its size",
)
