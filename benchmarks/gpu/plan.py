"""The GPU check's plan (pure, stdlib only): its settings from the environment, its steps in order with each one's
time box, and the clock that gives each step what is left of the check's deadline.

The GPU image's boxes add up to at most 8.5 minutes (``DEADLINE_S``) by construction (``total_s``; a test holds it):
a device is lent for minutes at a time and one command is cut at 10, so the check must end, with its evidence under
$OUT, whatever fails (DESIGN.md "The GPU check's clock"). The CPU-only work (flan-t5-large traces for `tuner explain`
and the estimate column) runs beside the steps at the lowest priority and is never waited for past the deadline: its
commands rerun on the CPU host from the returned files.

The boxes, from the first H200 run (../gpu-h200) and a reading of what each step runs:

* kit 30 s: 17 wheels installed into a site folder (about 10 s);
* env 15 s: versions, the GPU, the compilers (one torch import, nvidia-smi, nvcc, gcc);
* ops 105 s: cpu_adam (44.7 s measured on 16 cores) and fused_adam (nvcc, one arch: unmeasured) built in parallel;
* pinned 70 s: the baseline's setup under each pinned variant (deepspeed's 13.7 s, the others' unknown) and two
  cycles of steps each, one fork server;
* search 150 s: a 120 s budget (no probe starts that cannot end inside it) and the command's start and end;
* crash 50 s: their config at their worst batch, one probe that runs out of memory in its first forward;
* trainer 70 s: GPU_CHECK_STEPS (10) offloaded steps through Seq2SeqTrainer, its DeepSpeed setup, eval + generate;
* tables 15 s: the probe table, the OOM records, the crash and Trainer verdicts, read from the database;
* evidence 5 s: the database and the snapshots copied to $OUT (each copy is made as soon as its step ends too).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

DEADLINE_S = 510.0  # 8.5 minutes: the check's default deadline on a GPU, its steps' boxes included
DRY_DEADLINE_S = 780.0  # the dry run on a shared 2-core CPU host
FORCES = ("ops-fail", "search-timeout", "trainer-kill")  # GPU_CHECK_FORCE: failures the dry run is made to meet
FORCED_SEARCH_BOX_S = 30.0  # a search killed mid-probe (its study written: it exists in $OUT)
FORCED_TRAINER_BOX_S = 3.0  # a Trainer killed before its first step
SEARCH_START_S = 30.0  # what the search command takes beside its budget (start, the last probe's end, the summary)
MIN_SEARCH_BUDGET_S = 30.0  # a search with less budget than this is not run (it would measure nothing)


@dataclass(frozen=True)
class Step:
    """One step of the check: ``box_s`` its time box; ``min_s`` the least it is worth running with (else skipped)."""

    name: str
    box_s: float
    what: str
    min_s: float = 5.0


GPU_STEPS: tuple[Step, ...] = (
    Step("kit", 30, "the wheel kit installed into a site folder"),
    Step("env", 15, "versions, GPU, driver, compilers, arch list, allocator settings -> env.txt"),
    Step("ops", 105, "DeepSpeed's ops built in parallel, verbose -> ops.log", min_s=20),
    Step("pinned", 70, "the baseline's setup under each pinned variant; the fastest kept", min_s=20),
    Step("search", 150, "the search -> gpu-check.db", min_s=SEARCH_START_S + MIN_SEARCH_BUDGET_S),
    Step("crash", 50, "their config at their worst batch under their card -> crash-snapshot", min_s=20),
    Step("trainer", 70, "Seq2SeqTrainer on the pick's hf export, eval + generate", min_s=20),
    Step("tables", 15, "probe table, OOM records, crash and Trainer verdicts -> probes.txt"),
    Step("evidence", 5, "database and snapshots copied to $OUT", min_s=0),
)

# the dry run: a tiny T5 on the emulated device of a shared 2-core host, whose load can triple a step's time
# (DeepSpeed's imports alone take 5-15 s there): boxes that only stop a hung step
DRY_STEPS: tuple[Step, ...] = (
    Step("kit", 5, "the venv's site-packages stand in for the kit"),
    Step("env", 45, "versions, compilers, allocator settings -> env.txt"),
    Step("ops", 90, "DeepSpeed's ops (cached) checked in parallel, verbose -> ops.log", min_s=10),
    Step("pinned", 120, "the baseline's setup under each pinned variant (nothing pinned on CPU)", min_s=20),
    Step("search", 120, "the search -> gpu-check.db", min_s=SEARCH_START_S + MIN_SEARCH_BUDGET_S),
    Step("crash", 150, "their config at a longer length under the emulated device", min_s=20),
    Step("trainer", 150, "Seq2SeqTrainer on the pick's hf export, eval + generate", min_s=20),
    Step("tables", 60, "probe table, OOM records, crash and Trainer verdicts -> probes.txt"),
    Step("evidence", 5, "database copied to $OUT", min_s=0),
)


@dataclass(frozen=True)
class Job:
    """The job the check runs: the team's files on a model, at lengths, under a cap; and their crash."""

    model: str
    max_length: int
    target_length: int
    device_memory: str
    micro: str  # the space's micro batch choices, YAML
    bucket: int
    eval_batch: int
    crash_length: int
    crash_memory: str
    crash_gib: str  # the refused allocation their OOM text names ("" where the model cannot make it)


GPU_JOB = Job("builtin:flan-t5-large", 512, 128, "16GiB", "[2, 4, 8]", 200_000_000, 50, 6352, "79.15GiB", "4.81")
# their 2e8-element buckets (763 MiB each) run out of the emulated device: trial 0 is an OOM, the pick a smaller one;
# the crash runs their config at a longer length (its refused allocation is the bucket's, not attention's)
DRY_JOB = Job("builtin:tiny-t5", 32, 16, "160MiB", "[2, 4]", 2_000_000, 4, 64, "160MiB", "")


@dataclass(frozen=True)
class CheckConfig:
    """The check's settings, from the environment (``from_env``)."""

    dry: bool
    job: Job
    steps: tuple[Step, ...]
    deadline_s: float
    trainer_steps: int
    max_fixed_s: float
    min_probes: int
    forces: frozenset[str] = field(default_factory=frozenset)

    def step(self, name: str) -> Step:
        return next(s for s in self.steps if s.name == name)

    @property
    def total_s(self) -> float:
        return sum(s.box_s for s in self.steps)


def _seconds(text: str | None, default: float) -> float:
    """ "150s", "2m", "90" -> seconds; ValueError for anything else."""
    if not text:
        return default
    text = text.strip().lower()
    scale = 60.0 if text.endswith("m") else 1.0
    value = float(text.rstrip("sm"))
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{text!r} is not a positive duration")
    return value * scale


def from_env(env: Mapping[str, str] | None = None) -> CheckConfig:
    """The check's settings: DRY_RUN, GPU_CHECK_DEADLINE (seconds or 8m), GPU_CHECK_BUDGET (the search's budget: its
    box follows), GPU_CHECK_STEPS, GPU_CHECK_MAX_FIXED_S, GPU_CHECK_MIN_PROBES, GPU_CHECK_FORCE (comma-separated
    FORCES). ValueError, one line, for a value it cannot use."""
    env = os.environ if env is None else env
    dry = bool(env.get("DRY_RUN"))
    steps = DRY_STEPS if dry else GPU_STEPS
    budget = env.get("GPU_CHECK_BUDGET")
    if budget:
        search = next(s for s in steps if s.name == "search")
        boxed = replace(search, box_s=_seconds(budget, 0) + SEARCH_START_S)
        steps = tuple(boxed if s.name == "search" else s for s in steps)
    forces = frozenset(f.strip() for f in env.get("GPU_CHECK_FORCE", "").split(",") if f.strip())
    unknown = sorted(forces - set(FORCES))
    if unknown:
        raise ValueError(f"GPU_CHECK_FORCE names {', '.join(unknown)}; it takes {', '.join(FORCES)}")
    return CheckConfig(
        dry=dry,
        job=DRY_JOB if dry else GPU_JOB,
        steps=steps,
        deadline_s=_seconds(env.get("GPU_CHECK_DEADLINE"), DRY_DEADLINE_S if dry else DEADLINE_S),
        trainer_steps=int(env.get("GPU_CHECK_STEPS") or (4 if dry else 10)),
        max_fixed_s=float(env.get("GPU_CHECK_MAX_FIXED_S") or (60 if dry else 5)),  # a shared CPU: no claim on it
        min_probes=int(env.get("GPU_CHECK_MIN_PROBES") or (2 if dry else 4)),
        forces=forces,
    )


def forced_box(name: str, forces: frozenset[str]) -> float | None:
    """A forced failure's short box for step ``name`` (the dry run's GPU_CHECK_FORCE), None where none is forced."""
    if name == "search" and "search-timeout" in forces:
        return FORCED_SEARCH_BOX_S
    if name == "trainer" and "trainer-kill" in forces:
        return FORCED_TRAINER_BOX_S
    return None


def box_for(step: Step, left_s: float, reserve_s: float, forces: frozenset[str] = frozenset()) -> float:
    """The seconds ``step`` may run: its box (a forced failure's short one where asked), within what is left of the
    deadline less ``reserve_s`` (what the steps after it need at least). 0: less than it is worth running with."""
    forced = forced_box(step.name, forces)
    box = min(step.box_s if forced is None else forced, left_s - reserve_s)
    least = step.min_s if forced is None else min(step.min_s, forced)
    return box if box > 0 and box >= least else 0.0


def reserve_after(steps: tuple[Step, ...], name: str) -> float:
    """What the steps after ``name`` need at least: the tables' and the evidence's boxes (the others are skipped when
    nothing is left for them)."""
    names = [s.name for s in steps]
    later = steps[names.index(name) + 1 :]
    return sum(s.box_s for s in later if s.name in ("tables", "evidence"))


def search_budget(box_s: float) -> float:
    """The search's budget inside its box (its start and end beside it)."""
    return max(0.0, box_s - SEARCH_START_S)


def plan_lines(config: CheckConfig) -> list[str]:
    """The printed plan: each step with its box, their sum against the deadline, where the CPU traces run."""
    out = [f"plan ({'dry run, CPU' if config.dry else 'GPU'}): deadline {config.deadline_s:.0f} s"]
    for s in config.steps:
        budget = f" (budget {search_budget(s.box_s):.0f} s)" if s.name == "search" else ""
        out.append(f"  {s.name:<9}{s.box_s:>6.0f} s  {s.what}{budget}")
    fits = "within" if config.total_s <= config.deadline_s else "OVER"
    out.append(f"  {'total':<9}{config.total_s:>6.0f} s  {fits} the deadline ({config.deadline_s:.0f} s)")
    out.append(
        "  beside them, at the lowest priority and never waited for past the deadline: the CPU traces of "
        "`tuner explain --oom-message` (from second 0), `tuner explain --trial` and the estimate column (after the "
        "search); what is not done reruns on the CPU host from the returned files"
    )
    if config.forces:
        out.append(f"  forced: {', '.join(sorted(config.forces))}")
    return out


__all__ = [
    "DEADLINE_S",
    "DRY_JOB",
    "DRY_STEPS",
    "FORCES",
    "GPU_JOB",
    "GPU_STEPS",
    "CheckConfig",
    "Job",
    "Step",
    "box_for",
    "forced_box",
    "from_env",
    "plan_lines",
    "reserve_after",
    "search_budget",
]
