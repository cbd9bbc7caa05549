"""Response and request models of the HTTP API (they make the OpenAPI schema complete). No torch import."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from tuner import names
from tuner.bounded import ShapeError, check_shape, check_values
from tuner.declared import API, declared
from tuner.job.definition import JobFlags
from tuner.job.inline_data import MAX_INLINE_SAMPLES
from tuner.session.options import SearchOptions

STUDY_NAME_PATTERN = names.STUDY_NAME_PATTERN  # one rule for the API and `tuner search --study` (tuner.names)
STUDY_NAME_MAX = names.STUDY_NAME_MAX
#: a body's strings and keys at most (issue 42 §9: 100,000 wrap-class names in one 200 KB string were stored and
#: answered in a 602 KB 201; a 200 KB key was echoed in a 400): a setting's text is a name, a list, a dtype
MAX_BODY_TEXT = 4096
MAX_BODY_KEY = 256
Format = Literal["json", "deepspeed", "hf", "accelerate", "env", "launch", "recipe"]
TrialStateName = Literal["RUNNING", "COMPLETE", "PRUNED", "FAIL", "WAITING"]


class ErrorOut(BaseModel):
    detail: str = Field(description="what went wrong and how to fix it, in one line")


class ValidationErrorOut(ErrorOut):
    errors: list[dict[str, Any]] = Field(default_factory=list, description="each invalid field, as FastAPI reports it")


class HealthOut(BaseModel):
    status: Literal["ok"]
    storage: str = Field(description="the storage's scheme and database name (no user, host, port or path)")
    version: str


class RunOut(BaseModel):
    """One `tuner search` process that worked (or works) on the study."""

    id: int
    worker: str
    status: str
    started_at: dt.datetime
    deadline_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    heartbeat_at: dt.datetime | None = None
    budget_s: float | None = None
    message: str | None = None


class ProgressOut(BaseModel):
    started_at: dt.datetime | None = Field(None, description="when the first search run began")
    deadline_at: dt.datetime | None = Field(None, description="the latest deadline of a running search")
    elapsed_s: float | None = None
    remaining_s: float | None = None
    fraction: float | None = Field(None, description="elapsed / budget of the running search, 0..1")
    trials: int = Field(0, description="Optuna trials of the study, any state")
    probes: int = Field(0, description="probe rows recorded (run or inferred)")


class BestSoFarOut(BaseModel):
    trial_number: int | None
    config_key: str
    knobs: dict[str, Any]
    objective: float
    samples_per_s: float
    peak_allocated: int
    capacity: int | None
    confirmed: bool


class StudySummaryOut(BaseModel):
    name: str
    created_at: dt.datetime
    created_by: str
    status: Literal["defined", "running", "finished", "interrupted", "failed"] = Field(
        description="defined: no search joined yet; running: a search runs now; else the last run's end state"
    )


class StudyOut(StudySummaryOut):
    definition: dict[str, Any] = Field(description="what the study searches: model, space, world size, budget ...")
    budget_s: float | None = None
    progress: ProgressOut
    best: BestSoFarOut | None = Field(None, description="the best stable config so far; null when none yet")
    trial_states: dict[str, int] = Field(description="Optuna trials by state (COMPLETE, PRUNED, FAIL, RUNNING ...)")
    probe_statuses: dict[str, int] = Field(
        description="probe rows by status/cause (ok, oom, timeout, error, inferred-oom)"
    )
    runs: list[RunOut]


class StudyListOut(BaseModel):
    studies: list[StudySummaryOut]


class RankMemoryOut(BaseModel):
    model_config = ConfigDict(extra="allow")

    rank: int
    peak_allocated: int = 0
    peak_reserved: int = 0
    capacity: int | None = None
    alloc_retries: int = 0


class ProbeOut(BaseModel):
    id: int
    fidelity: str
    status: str
    cause: str | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    objective: float | None = None
    peak_allocated: int | None = None
    peak_reserved: int | None = None
    capacity: int | None = None
    stable: bool
    probe_seconds: float | None = None
    ranks: list[RankMemoryOut] = Field(default_factory=list, description="peak memory of each rank")
    created_at: dt.datetime


class TrialOut(BaseModel):
    number: int | None = Field(description="the Optuna trial number; null for a probe recorded without a trial")
    state: str = Field(description="Optuna state: COMPLETE, PRUNED, FAIL, RUNNING, WAITING")
    params: dict[str, Any]
    value: float | None = Field(None, description="the objective Optuna recorded")
    cause: str | None = Field(None, description="why it was pruned or failed (oom, inferred-oom, timeout, error text)")
    samples_per_s: float | None = None
    peak_allocated: int | None = None
    ranks: list[RankMemoryOut] = Field(default_factory=list, description="per-rank peak memory of the latest probe")
    probes: list[ProbeOut] = Field(default_factory=list)


class TrialPageOut(BaseModel):
    study: str
    total: int = Field(description="trials of the study (of `state`, when given)")
    offset: int
    limit: int
    state: str | None = Field(None, description="the Optuna state the page is filtered to; null: every state")
    trials: list[TrialOut]


class BaselineOut(BaseModel):
    status: str = Field(description="the baseline probe's status: ok, oom, timeout, error")
    samples_per_s: float | None = None
    objective: float | None = None
    peak_allocated: int | None = None
    stable: bool
    speedup: float | None = Field(
        None,
        description="the pick's objective / the baseline's (each the median of its probes, rounded as printed); "
        "null when the baseline failed",
    )


class ChangeOut(BaseModel):
    file: str = Field(description="'training args' or 'deepspeed' (the user's file), 'knobs' without a baseline")
    key: str = Field(description="dotted path in that file")
    old: Any = None
    new: Any = None
    added: bool = False
    removed: bool = False


class ChangesOut(BaseModel):
    changes: list[ChangeOut] = Field(description="what the export changes in the user's files, old -> new")
    fixed: str | None = Field(None, description="the job, held fixed")
    not_probed: list[str] = Field(default_factory=list, description="keys of the user's files carried, not probed")
    verdict: str | None = Field(None, description="against the user's config: the speed-up, or where it ran out")
    written_for: str | None = Field(None, description="which transformers the training-args export names fields for")
    engine: str | None = Field(None, description="the pick's engine in words, and the user's when it differs")
    lines: list[str] = Field(default_factory=list, description="the same, as `tuner best --changes` prints it")


class ProductionOut(BaseModel):
    status: str
    cause: str | None = None
    phase: str | None = Field(None, description="where a failed run was: train or eval")
    peak_allocated: int | None = Field(None, description="bytes: CUDA max_memory_allocated, or host peak RSS on CPU")
    peak_reserved: int | None = None
    capacity: int | None = None
    memory: str | None = Field(None, description="what peak_allocated measures")
    samples_per_s: float | None = None
    probed_peak: int | None = Field(None, description="the highest peak the probes of this config measured")
    probed_samples_per_s: float | None = None
    device: str | None = None
    rank: int | None = None
    steps: int | None = None


class BestConfigOut(BaseModel):
    study: str
    format: Format
    trial_number: int | None
    config_key: str
    knobs: dict[str, Any]
    engine: str = Field(
        "deepspeed", description="deepspeed | fsdp2 | torch: what the exports configure (fsdp2: no DeepSpeed JSON)"
    )
    world_size: int
    nnodes: int = Field(1, description="the nodes the pick was measured across (world_size / nnodes ranks on each)")
    gradient_accumulation_steps: int
    global_batch: int
    objective: float = Field(
        description="the pick's throughput in the study's objective unit (samples/s, or retained tokens/s when the "
        "search varied max_length): the median of its probes, the figure every face of tuner shows"
    )
    samples_per_s: float = Field(description="the median samples/s of its probes")
    tokens_per_s: float | None = None
    peak_allocated: int = Field(description="bytes, max over ranks and measurements")
    peak_reserved: int | None = None
    capacity: int | None = Field(None, description="bytes each rank could use")
    headroom: float = Field(description="the study's stability threshold: peak <= headroom x capacity")
    memory_fraction: float | None = Field(None, description="peak_allocated / capacity")
    confirmed: bool = Field(description="re-probed longer and still stable")
    caveat: str | None = Field(
        None, description='"not confirmed: ..." when the pick was never re-probed longer (null when confirmed)'
    )
    measurements: int
    fingerprint: dict[str, Any] = Field(default_factory=dict, description="hardware the config was measured on")
    versions: dict[str, str] = Field(default_factory=dict, description="torch, deepspeed, transformers versions")
    baseline: BaselineOut | None = None
    changes: ChangesOut | None = None
    production: list[ProductionOut] = Field(
        default_factory=list, description="your real training runs of this config (TunerCallback), as recorded"
    )
    content: str | None = Field(None, description="the config rendered in `format` (null for format=json)")


class StudyBody(BaseModel):
    """A study definition that `tuner search --study NAME` workers then join.

    Inline data only: no paths, no commands. Beside ``name`` and ``budget_s``, its fields are the declared settings
    of a search (tuner.session.options.SearchOptions, tuner.job.definition.JobFlags) that a study definition holds:
    the same names, types, defaults and help as `tuner search`'s options and ``tuner.tune``'s keywords."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=STUDY_NAME_MAX, pattern=STUDY_NAME_PATTERN)
    budget_s: float = Field(7200.0, gt=0, le=30 * 86400, description="the study's nominal budget, seconds")

    @model_validator(mode="before")
    @classmethod
    def _bounded(cls, data: Any) -> Any:
        """Nesting and size bounded (tuner.bounded) before any field is read: 422 naming the path, nothing stored.
        ``sample_lengths`` (up to MAX_INLINE_SAMPLES [input, target] pairs: 3 items each) has its own item bound,
        one pair over it, so its field's validator names the limit; the rest of the body has the config's."""
        try:
            if isinstance(data, dict) and "sample_lengths" in data:
                rest = {key: value for key, value in data.items() if key != "sample_lengths"}
                check_shape(rest, "body")
                check_shape(data["sample_lengths"], "body.sample_lengths", 3 * (MAX_INLINE_SAMPLES + 1))
            else:
                check_shape(data, "body")
            check_values(data, "body", MAX_BODY_TEXT, MAX_BODY_KEY)  # what a definition stores, per field
        except ShapeError as err:
            raise ValueError(str(err)) from None
        return data


def _declared_fields() -> dict[str, Any]:
    """The body's fields from the settings declared for the API (tuner.declared)."""
    out: dict[str, Any] = {}
    for d in declared(SearchOptions, API) + declared(JobFlags, API):
        bounds: dict[str, Any] = {"ge": d.spec.min} if d.spec.min is not None else {}
        bounds.update(d.spec.api)
        described = Field(... if d.required else d.default, description=d.spec.api_help or d.spec.help, **bounds)
        out[d.name] = (d.spec.api_type if d.spec.api_type is not None else d.type, described)
    return out


if TYPE_CHECKING:
    StudyCreate = StudyBody
else:
    StudyCreate = create_model("StudyCreate", __base__=StudyBody, __doc__=StudyBody.__doc__, **_declared_fields())
