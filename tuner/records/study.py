"""A study's definition (tuner_studies.definition: what a study searches, as tuner.search.request.SearchRequest
writes it) and a study's stored row, as typed records. The storage builds them once from the stored JSON
(tuner.storage.Store.definition / studies / study); search, export, the API, the CLI and the report read fields.

The parts that are pydantic models of the layers above (the model, the job, the space, the objective, the baseline's
knobs) stay their JSON here, typed as mappings: this floor imports nothing above it, and each reader validates the part
it uses with its own model (tuner.job.definition.Job, tuner.job.space.space_from_definition ...). The user's own files
(``baseline_source``: their DeepSpeed JSON; ``baseline_files``) are kept as stored: they are the user's documents, not
record fields. Keys the record does not know (a later version's) are kept in ``extra`` and written back."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tuner.records.probe import DEFAULT_HEADROOM
from tuner.records.ruled_out import RecordError

_JSON_PARTS = (
    "model",
    "job",
    "space",
    "objective",
    "baseline",
    "baseline_files",
    "trainer",
    "fsdp",
    "host",
    "data",
    "trace",
)
_SCALARS = (
    "job_changes",
    "world_size",
    "global_batch",
    "device_memory",
    "headroom",
    "budget_s",
    "finalists",
    "nnodes",
    "files_global_batch",
)
_KNOWN = frozenset((*_JSON_PARTS, *_SCALARS, "baseline_source"))


def _mapping(name: str, value: Any, where: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise RecordError(f"study definition {where}: {name} is {type(value).__name__}, not an object")
    return dict(value)


def _int(name: str, value: Any, where: str, least: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value or value < least:
        raise RecordError(f"study definition {where}: {name} {value!r} is not a whole number of at least {least}")
    return int(value)


@dataclass(frozen=True)
class StudyDefinition:
    """Every field may be missing in a study stored by an older version (None), never wrong: the invariants (whole
    numbers of at least 1 for the world size, the global batch and the device memory; a headroom in (0, 1]; the JSON
    parts objects) are checked when the record is built, and a broken one is a RecordError naming the field."""

    model: dict[str, Any] | None = None  # trials.contract.ModelSpec as JSON
    job: dict[str, Any] | None = None  # tuner.job.definition.Job as JSON (None: a study from before the job)
    job_changes: tuple[str, ...] = ()  # job knobs a space file searches on purpose
    space: dict[str, Any] | None = None  # tuner.job.space.Space as JSON
    world_size: int | None = None
    global_batch: int | None = None
    device_memory: int | None = None  # bytes per rank the user set (None: the device's)
    headroom: float = DEFAULT_HEADROOM
    objective: dict[str, Any] | None = None  # tuner.job.objective.Objective as JSON
    budget_s: float | None = None
    baseline: dict[str, Any] | None = None  # the baseline's trials.contract.Knobs as JSON
    baseline_source: Any = None  # the user's DeepSpeed JSON as the probes run it ("auto" resolved): their document
    baseline_files: dict[str, Any] | None = None  # the user's files as given (tuner.interop.export.own.UserFiles)
    # the Trainer the baseline's "auto" was filled for: {"transformers": version, "fixes": [TrainerFix as JSON]}
    # (tuner.interop.trainer_fill); None: a study without a baseline, or stored before
    trainer: dict[str, Any] | None = None
    # the user's FSDP2 settings every fsdp2 probe held (trials.contract.FsdpSettings as JSON); None: accelerate's
    fsdp: dict[str, Any] | None = None
    finalists: int | None = None
    host: dict[str, Any] | None = None  # tuner.session.host_record.HostRecord as JSON, once a worker recorded it
    data: dict[str, Any] | None = None  # tuner.job.length_summary.LengthSummary as JSON (a study with the user's data)
    trace: dict[str, Any] | None = None  # tuner.memory.trace.Trace as JSON, once a worker traced (a study with data)
    nnodes: int | None = None  # the nodes its probes span (None: one host, or a study stored before nodes existed)
    files_global_batch: int | None = None  # their files' global batch where the study's is a change they asked for
    extra: dict[str, Any] = field(default_factory=dict)  # keys this version does not know, kept as stored

    @property
    def model_source(self) -> str | None:
        source = (self.model or {}).get("source")
        return str(source) if source is not None else None

    @classmethod
    def from_json(cls, stored: Mapping[str, Any], study: str = "?") -> StudyDefinition:
        """The record from the stored JSON; RecordError naming the study and the field when one is broken."""
        if not isinstance(stored, Mapping):
            raise RecordError(f"study definition {study}: stored as {type(stored).__name__}, not an object")
        model = stored.get("model")
        if isinstance(model, str):  # stored as the bare source by an early version
            stored = {**stored, "model": {"source": model}}
        parts = {name: _mapping(name, stored.get(name), study) for name in _JSON_PARTS}
        headroom = stored.get("headroom")
        if headroom is None:
            headroom = DEFAULT_HEADROOM
        if isinstance(headroom, bool) or not isinstance(headroom, (int, float)) or not 0 < headroom <= 1:
            raise RecordError(f"study definition {study}: headroom {headroom!r} is not in (0, 1]")
        budget = stored.get("budget_s")
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget < 0):
            raise RecordError(f"study definition {study}: budget_s {budget!r} is not a number of seconds")
        changes = stored.get("job_changes") or ()
        if isinstance(changes, (str, Mapping)) or not all(isinstance(c, str) for c in changes):
            raise RecordError(f"study definition {study}: job_changes {changes!r} is not a list of knob names")
        return cls(
            **parts,
            job_changes=tuple(changes),
            world_size=_int("world_size", stored.get("world_size"), study, 1),
            global_batch=_int("global_batch", stored.get("global_batch"), study, 1),
            device_memory=_int("device_memory", stored.get("device_memory"), study, 1),
            headroom=float(headroom),
            budget_s=float(budget) if budget is not None else None,
            baseline_source=stored.get("baseline_source"),
            finalists=_int("finalists", stored.get("finalists"), study, 0),
            nnodes=_int("nnodes", stored.get("nnodes"), study, 1),
            files_global_batch=_int("files_global_batch", stored.get("files_global_batch"), study, 1),
            extra={k: v for k, v in stored.items() if k not in _KNOWN},
        )

    @classmethod
    def of(cls, definition: StudyDefinition | Mapping[str, Any]) -> StudyDefinition:
        """The record itself, or one built from a definition's JSON (a caller holding what it stored)."""
        return definition if isinstance(definition, StudyDefinition) else cls.from_json(definition)

    def to_json(self) -> dict[str, Any]:
        """The stored JSON (what SearchRequest.definition writes; ``trainer``, ``fsdp``, ``host``, ``data`` and
        ``trace`` only when set)."""
        out: dict[str, Any] = {
            "model": self.model,
            "job": self.job,
            "job_changes": list(self.job_changes),
            "space": self.space,
            "world_size": self.world_size,
            "global_batch": self.global_batch,
            "device_memory": self.device_memory,
            "headroom": self.headroom,
            "objective": self.objective,
            "budget_s": self.budget_s,
            "baseline": self.baseline,
            "baseline_source": self.baseline_source,
            "baseline_files": self.baseline_files,
            "finalists": self.finalists,
        }
        # only once known: older JSON stays
        for name in ("trainer", "fsdp", "host", "data", "trace", "nnodes", "files_global_batch"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return {**out, **self.extra}


@dataclass(frozen=True)
class StudyRecord:
    """A study as tuner_studies stores it: its name, when and by what it was created, and its definition."""

    name: str
    created_at: dt.datetime | None
    created_by: str
    definition: StudyDefinition

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> StudyRecord:
        name = str(record["name"])
        return cls(
            name=name,
            created_at=record.get("created_at"),
            created_by=str(record.get("created_by") or "-"),
            definition=StudyDefinition.from_json(record["definition"], name),
        )


__all__ = ["StudyDefinition", "StudyRecord"]
