"""The search space: which values each knob (a trials.contract.Knobs field) may take, loaded from YAML or TOML.

Every knob is a list of choices. A file may write a knob as a list, a single value (fixed), or an integer range
``{low: 1, high: 64, scale: pow2}`` (``scale: linear`` with ``step`` for evenly spaced values). Knobs left out keep the
built-in default's choices. Conditional knobs are only sampled where they apply: ZeRO settings only for the DeepSpeed
engine; bucket sizes, overlap_comm, contiguous_gradients and offload only for ZeRO stage >= 1, offload_param (parameter
offload) only for ZeRO-3; reshard_after_forward
and offload_params only for the FSDP2 engine; across nodes, ZeRO++ (zero_hpz_partition_size, zero_quantized_weights,
zero_quantized_gradients) only for ZeRO-3 and dp_replicate_size (HSDP) only for FSDP2.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import tomllib
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from trials.contract import FSDP_KNOBS, NODE_KNOBS, ZERO_PP_KNOBS, Engine, Knobs, Precision
from tuner.bounded import MAX_DEPTH, ShapeError, check_shape, read_text_file
from tuner.bounded_yaml import loads_yaml
from tuner.errors import LimitError, SpaceError
from tuner.job.space_values import MAX_CHOICES, as_list, to_int
from tuner.job.space_values import IntRange as IntRange  # re-exported: a space file's range

DEFAULT_SPACE_FILE = Path(__file__).with_name("default_space.yaml")
# Workers list every config of the space when they start (the proposers, the memory trace): a space is counted, never
# enumerated, when it is checked, and refused above this many configs (about 6 s of enumeration on this machine).
MAX_CONFIGS = 100_000
# PYTORCH_CUDA_ALLOC_CONF syntax: comma-separated option:value pairs (expandable_segments:True,max_split_size_mb:128);
# checked when the space is read, not when the export renders the pick after the whole search
ALLOC_CONF_SYNTAX = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*:[^,:\s]+(,[A-Za-z_][A-Za-z0-9_]*:[^,:\s]+)*$")
MAX_ALLOC_CONF = 512
MAX_WORLD_SIZE = 64  # a probe starts every rank on one host (tuner.probing.runner)
MAX_GLOBAL_BATCH = 1_000_000  # samples per optimizer step
ZERO_KNOBS = (
    "allgather_bucket_size",
    "reduce_bucket_size",
    "overlap_comm",
    "contiguous_gradients",
    "offload_optimizer",
)


class SpaceTooLarge(SpaceError, LimitError):
    """A space (or one knob's range) past MAX_CHOICES / MAX_CONFIGS: one line, exit 2, HTTP 422."""


class Suggester(Protocol):
    """What Space.sample needs from an Optuna trial (optuna.Trial satisfies it)."""

    def suggest_categorical(self, name: str, choices: Any) -> Any: ...


#: the values a knob may take (a job setting that is also a knob, e.g. max_length, is held to the same)
KNOB_RANGES: dict[str, tuple[int, int]] = {
    "micro_batch_size": (1, 65536),
    "max_length": (1, 1048576),
    "zero_stage": (0, 3),
    "eval_batch_size": (1, 65536),
    "allgather_bucket_size": (1, 10**11),
    "reduce_bucket_size": (1, 10**11),
    "zero_hpz_partition_size": (1, 1024),
    "dp_replicate_size": (1, 1024),
}


class Space(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    micro_batch_size: list[int] = Field(min_length=1)
    max_length: list[int] = Field(min_length=1)
    engine: list[Engine] = Field(default=["deepspeed"], min_length=1)
    zero_stage: list[int] = Field(default=[0, 1, 2, 3], min_length=1)
    allgather_bucket_size: list[int | None] = Field(default=[None], min_length=1)
    reduce_bucket_size: list[int | None] = Field(default=[None], min_length=1)
    overlap_comm: list[bool] = Field(default=[False], min_length=1)
    contiguous_gradients: list[bool] = Field(default=[True], min_length=1)
    offload_optimizer: list[bool] = Field(default=[False], min_length=1)
    offload_param: list[bool] = Field(default=[False], min_length=1)  # ZeRO-3's parameter offload
    gradient_checkpointing: list[bool] = Field(default=[False], min_length=1)
    precision: list[Precision] = Field(default=["fp32"], min_length=1)
    alloc_conf: list[str | None] = Field(default=[None], min_length=1)
    eval_batch_size: list[int | None] = Field(default=[None], min_length=1)
    generate: list[bool] = Field(default=[False], min_length=1)
    reshard_after_forward: list[bool] = Field(default=[True], min_length=1)
    offload_params: list[bool] = Field(default=[False], min_length=1)
    # across nodes (trials.contract.NODE_KNOBS): ZeRO++ of ZeRO-3, FSDP2's replicate degree (HSDP)
    zero_hpz_partition_size: list[int | None] = Field(default=[None], min_length=1)
    zero_quantized_weights: list[bool] = Field(default=[False], min_length=1)
    zero_quantized_gradients: list[bool] = Field(default=[False], min_length=1)
    dp_replicate_size: list[int | None] = Field(default=[None], min_length=1)

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The across-node knobs only where a choice is given (a stored space of a study from before them, and of any
        one-node study, keeps its JSON: a resume compares it)."""
        data: dict[str, Any] = handler(self)
        for name in (*NODE_KNOBS, "offload_param"):  # offload_param likewise, where only off
            if data.get(name) in ([None], [False]):
                data.pop(name, None)
        return data

    @field_validator("*", mode="before")
    @classmethod
    def _listify(cls, value: Any) -> Any:
        return as_list(value)

    @field_validator("allgather_bucket_size", "reduce_bucket_size", mode="before")
    @classmethod
    def _bucket_ints(cls, value: Any) -> Any:
        """Runs before _listify (pydantic runs "before" validators last-defined first): a range's ends as 5e7 too."""
        if isinstance(value, dict):
            value = {key: to_int(v) for key, v in value.items()}
        return [to_int(v) for v in as_list(value)]

    @field_validator("alloc_conf", mode="after")
    @classmethod
    def _alloc_syntax(cls, value: list[str | None]) -> list[str | None]:
        for v in value:
            if v is not None and (len(v) > MAX_ALLOC_CONF or not ALLOC_CONF_SYNTAX.match(v)):
                shown = v if len(v) <= 60 else v[:57] + "..."
                raise ValueError(
                    f"{shown!r} is not PyTorch allocator syntax; write option:value pairs separated by commas, e.g. "
                    "expandable_segments:True,max_split_size_mb:128"
                )
        return value

    @field_validator("*", mode="after")
    @classmethod
    def _distinct(cls, value: list[Any]) -> list[Any]:
        if len(value) > MAX_CHOICES:
            raise PydanticCustomError(
                "too_many", "{n} choices; at most {most} per knob", {"n": len(value), "most": MAX_CHOICES}
            )
        if len(set(map(repr, value))) != len(value):
            raise ValueError("repeats a value")
        return value

    @model_validator(mode="after")
    def _ranges(self) -> Space:
        for name, (low, high) in KNOB_RANGES.items():
            for v in getattr(self, name):
                if v is not None and not low <= v <= high:
                    raise ValueError(f"knob {name!r}: value {v} is outside [{low}, {high}]")
        if "torch" in self.engine and "deepspeed" not in self.engine and any(self.zero_stage):
            raise ValueError(
                "knob 'zero_stage': engine 'torch' has no ZeRO stage; list engine: [deepspeed] or zero_stage: [0]"
            )
        n = self.count()
        if n > MAX_CONFIGS:
            raise PydanticCustomError(
                "too_many",
                "space: {n} configs; at most {most}: give fewer choices per knob (the product of the choices counts)",
                {"n": n, "most": MAX_CONFIGS},
            )
        return self

    def count(self) -> int:
        """The number of distinct configs (what ``configs()`` yields), computed from the choices without listing them:
        conditional knobs count only where they apply, as ``sample`` draws them."""
        n = len
        common = n(self.micro_batch_size) * n(self.max_length) * n(self.gradient_checkpointing) * n(self.precision)
        zero_rest = n(self.reduce_bucket_size) * n(self.overlap_comm) * n(self.contiguous_gradients)
        zero_rest *= n(self.offload_optimizer)
        zero_pp = n(self.zero_hpz_partition_size) * n(self.zero_quantized_weights) * n(self.zero_quantized_gradients)
        per_stage = {0: 1, 1: n(self.allgather_bucket_size) * zero_rest, 3: zero_rest * zero_pp * n(self.offload_param)}
        per_engine = {
            "deepspeed": sum(per_stage.get(stage, per_stage[1]) for stage in self.zero_stage),
            "fsdp2": n(self.reshard_after_forward) * n(self.offload_params) * n(self.dp_replicate_size),
        }
        engines = sum(per_engine.get(engine, 1) for engine in self.engine)
        evals = sum(1 if e is None else n(self.generate) for e in self.eval_batch_size)
        return engines * common * n(self.alloc_conf) * evals

    # -- sampling ----------------------------------------------------------------------------------------------------
    def _pick(self, trial: Suggester, name: str) -> Any:
        choices = getattr(self, name)
        if len(choices) == 1:
            return choices[0]
        return trial.suggest_categorical(name, choices)

    def sample(self, trial: Suggester) -> Knobs:
        """Draws one config, suggesting only the knobs that apply given the ones drawn before."""
        values: dict[str, Any] = {"engine": self._pick(trial, "engine")}
        for name in ("micro_batch_size", "max_length", "gradient_checkpointing", "precision"):
            values[name] = self._pick(trial, name)
        values.update(self._engine_knobs(trial, values["engine"]))
        for name in ("alloc_conf", "eval_batch_size"):
            values[name] = self._pick(trial, name)
        if values["eval_batch_size"] is not None:
            values["generate"] = self._pick(trial, "generate")
        return Knobs(**values)

    def _engine_knobs(self, trial: Suggester, engine: str) -> dict[str, Any]:
        """The knobs only ``engine`` reads, each drawn only where it applies (bucket sizes and the rest for ZeRO >= 1,
        ZeRO++ for ZeRO-3, the replicate degree for FSDP2)."""
        if engine == "fsdp2":
            return {name: self._pick(trial, name) for name in (*FSDP_KNOBS, "dp_replicate_size")}
        if engine != "deepspeed":
            return {}
        stage = self._pick(trial, "zero_stage")
        out: dict[str, Any] = {"zero_stage": stage}
        if stage >= 1:
            for name in ZERO_KNOBS:
                if name != "allgather_bucket_size" or stage != 3:  # stage 3 gathers by its own prefetch buckets
                    out[name] = self._pick(trial, name)
        if stage == 3:
            out.update({name: self._pick(trial, name) for name in (*ZERO_PP_KNOBS, "offload_param")})
        return out

    def configs(self) -> Iterator[Knobs]:
        """Every distinct config of the space (the full grid), conditional knobs respected."""
        seen: set[str] = set()
        stack: list[dict[str, Any]] = [{}]
        while stack:
            fixed = stack.pop()
            probe = _GridTrial(fixed)
            knobs = self.sample(probe)
            if probe.branch is not None:
                name, choices = probe.branch
                for c in reversed(choices):
                    stack.append({**fixed, name: c})
                continue
            key = knobs_key(knobs)
            if key not in seen:
                seen.add(key)
                yield knobs

    def size(self) -> int:
        return self.count()

    def restrict(self, **choices: list[Any]) -> Space:
        return Space.model_validate({**self.model_dump(), **choices})


class _GridTrial:
    """Walks the conditional tree: answers fixed choices, stops at the first unanswered one."""

    def __init__(self, fixed: dict[str, Any]) -> None:
        self.fixed = fixed
        self.branch: tuple[str, list[Any]] | None = None

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        if name in self.fixed:
            return self.fixed[name]
        if self.branch is None:
            self.branch = (name, list(choices))
        return next(iter(choices))


def check_job_limits(world_size: int, global_batch: int, option: Callable[[str], str] = str) -> None:
    """The bounds of a search's world size and global batch, checked when a study is defined (`tuner search`,
    ``POST /studies``). The GPUs a worker host shows are tuner.probing.gpus.check_world_size's (at search start)."""
    if world_size > MAX_WORLD_SIZE:
        raise LimitError(
            f"{option('world_size')} {world_size} is above {MAX_WORLD_SIZE}: a probe runs all its ranks on one host"
        )
    if global_batch > MAX_GLOBAL_BATCH:
        raise LimitError(
            f"global batch {global_batch} is above {MAX_GLOBAL_BATCH:,} samples per step; set "
            f"{option('global_batch')} (without it: lcm of the micro batch choices x world size)"
        )


def knobs_key(knobs: Knobs) -> str:
    return json.dumps(knobs.model_dump(mode="json"), sort_keys=True)


def config_key(knobs: Knobs, world_size: int, gradient_accumulation_steps: int) -> str:
    """Stable hash of what decides a probe's memory and speed: the knobs, world size and accumulation."""
    payload = {"knobs": knobs.model_dump(mode="json"), "world_size": world_size, "accum": gradient_accumulation_steps}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:32]


def _read(path: Path) -> dict[str, Any]:
    if path.is_dir() or not path.exists():
        what = "is a directory" if path.is_dir() else "does not exist"
        raise SpaceError(f"space file {path} {what}; give a YAML or TOML file (see tuner/job/default_space.yaml)")
    text = read_text_file(path, "space file", error=SpaceError)
    if path.suffix.lower() != ".toml":  # aliases counted expanded, libyaml's parser (issue 42 §3)
        data = loads_yaml(text, f"space file {str(path)[:200]}", error=SpaceError)
    else:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            first = str(err).strip().splitlines()[0][:200]
            raise SpaceError(f"space file {path} is not valid toml: {first}") from None
        except RecursionError:
            raise ShapeError(f"space file {path} nests deeper than {MAX_DEPTH} levels") from None
        check_shape(data, f"space file {path}")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpaceError(
            f"space file {path} must be a mapping of knob name to choices, e.g. 'micro_batch_size: [1, 2, 4]'"
        )
    return data


def _one_line(err: ValidationError, source: str) -> str:
    first = err.errors()[0]
    loc = [str(p) for p in first["loc"] if not isinstance(p, int)]
    key = loc[0] if loc else "space"
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        known = ", ".join(Space.model_fields)
        return f"{source}: unknown knob {key!r}; known knobs: {known}"
    if first["type"] == "too_many" and msg.startswith("space:"):
        return f"{source}: {msg.removeprefix('space: ')}"
    if key == "space" and ":" in msg:
        return f"{source}: {msg}"
    return f"{source}: knob {key!r}: {msg}"


def space_from_dict(data: dict[str, Any], source: str = "space") -> Space:
    try:
        return Space.model_validate(data)
    except ValidationError as err:
        kind = SpaceTooLarge if err.errors()[0]["type"] == "too_many" else SpaceError
        raise kind(_one_line(err, source)) from None


def default_space() -> Space:
    return space_from_dict(_read(DEFAULT_SPACE_FILE), str(DEFAULT_SPACE_FILE.name))


def load_space(path: str | Path | None = None) -> Space:
    """The built-in default, overridden knob by knob by the file at ``path`` (YAML or TOML)."""
    base = _read(DEFAULT_SPACE_FILE)
    if path is None:
        return space_from_dict(base, DEFAULT_SPACE_FILE.name)
    path = Path(path)
    user = _read(path)
    unknown = sorted(set(user) - set(Space.model_fields))
    if unknown:
        raise SpaceError(f"{path}: unknown knob {unknown[0]!r}; known knobs: {', '.join(Space.model_fields)}")
    return space_from_dict({**base, **user}, str(path))


def space_file_knobs(path: str | Path) -> set[str]:
    """The knobs a space file names (those it sets on purpose, e.g. a job knob like precision or max_length)."""
    return set(_read(Path(path)))


def space_from_definition(data: dict[str, Any]) -> Space:
    return space_from_dict(data, "stored study space")


def inline_space(inline: Mapping[str, Any] | None, source: str = "space") -> Space:
    """The default space overridden knob by knob by an inline mapping (an API body's ``space``,
    ``tuner.tune(space={...})``): a bare value means one choice, as in a space file; lists and {low, high, scale}
    ranges pass as they are."""
    base = default_space().model_dump(mode="json")
    if not inline:
        return space_from_dict(base, "default space")
    unknown = sorted(set(inline) - set(Space.model_fields))
    if unknown:
        raise SpaceError(f"{source}: unknown knob {unknown[0]!r}; known knobs: {', '.join(Space.model_fields)}")
    choices = {k: v if isinstance(v, (list, dict)) else [v] for k, v in inline.items()}
    try:
        return space_from_dict({**base, **choices}, source)
    except (TypeError, ValueError) as err:  # a validator that choked on a shape it did not expect
        raise SpaceError(f"{source}: invalid choices ({err}); give each knob a list of values") from None
