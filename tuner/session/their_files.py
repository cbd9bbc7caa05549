"""The user's own files (or their contents as mappings) read as `tuner search` and ``tuner.tune`` read them: the
loader tuner.search.request.build_request calls once it knows the world size and the longest length. With their files
the model is theirs to name (``DEFAULT_MODEL`` is the default only without files)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tuner.errors import BaselineError, ConfigError
from tuner.search.request import BaselineLoader

if TYPE_CHECKING:
    from tuner.interop.baseline import Baseline

DEFAULT_MODEL = "builtin:tiny-t5"
FileOrMapping = Path | str | Mapping[str, Any]


class TheirFiles(Protocol):
    """What of a search's options says which files are theirs (tuner.session.options.SearchOptions)."""

    @property
    def baseline(self) -> FileOrMapping | None: ...
    @property
    def training_args(self) -> FileOrMapping | None: ...
    @property
    def transformers_version(self) -> str | None: ...
    @property
    def model(self) -> str: ...
    @property
    def given(self) -> frozenset[str]: ...


def local_baseline(o: TheirFiles, option: Callable[[str], str], loaded: list[Baseline]) -> BaselineLoader | None:
    """The baseline of `tuner search` and ``tuner.tune``: the user's own files (or their contents as mappings)."""
    if o.training_args is not None and o.baseline is None:
        raise BaselineError(
            f"{option('training_args')} goes with {option('baseline')} (your DeepSpeed JSON or accelerate config); "
            f"pass both, or the training args alone as {option('baseline')}"
        )
    from tuner.interop.trainer_fill import checked_version

    version = checked_version(o.transformers_version, option)
    if o.baseline is None:
        return None
    load = _baseline_loader(o.baseline, o.training_args, loaded, version)
    if o.model != DEFAULT_MODEL or "model" in o.given or recipe_model(o) is not None:
        return load

    def unnamed(world: int | None, max_length: int) -> Baseline:  # their files read first: what is wrong in them
        load(world, max_length)
        raise ConfigError(
            f"pass {option('model')} with your files: the model your training loads (an HF id like "
            f"google/flan-t5-large, or its directory); {DEFAULT_MODEL} is the default only without files"
        )

    return unnamed


def recipe_model(o: TheirFiles) -> str | None:
    """The model a TRL recipe among their files trains where no model was named (``named_model``)."""
    if o.model != DEFAULT_MODEL or "model" in o.given:
        return None
    return named_model(o.baseline, o.training_args)


def named_model(*files: FileOrMapping | None) -> str | None:
    """The model a TRL recipe among ``files`` trains (its ModelConfig ``model_name_or_path``): the model of their job.
    None without one, or where their files cannot be read (their loader says why)."""
    from tuner.interop.baseline_files import read_json
    from tuner.job.ledger.trl import read_recipe

    for given in files:
        if given is None:
            continue
        try:
            data = dict(given) if isinstance(given, Mapping) else read_json(Path(given), "training-args file")
            recipe = read_recipe(data)
        except (BaselineError, ConfigError, ValueError, TypeError):
            return None
        named = data.get("model_name_or_path")
        if recipe.kind is not None and isinstance(named, str) and named.strip():
            return named.strip()
    return None


def _mapping(given: Mapping[str, Any], what: str) -> dict[str, Any]:
    """A baseline given as a mapping, its nesting and size bounded as a file's (tuner.bounded)."""
    from tuner.bounded import check_shape

    check_shape(given, what)
    return dict(given)


def _baseline_loader(
    baseline: FileOrMapping,
    training_args: FileOrMapping | None,
    loaded: list[Baseline],
    transformers_version: str | None = None,
) -> Callable[[int | None, int], Baseline]:
    """Parses the user's files for a world size and the longest length (build_request calls it once it knows
    them), "auto" filled as ``transformers_version``'s Trainer fills it, keeping the parsed baseline in ``loaded``."""

    def load(world: int | None, max_length: int) -> Baseline:
        from tuner.interop.baseline import parse_baseline
        from tuner.interop.baseline_files import file_kind, load_baseline, read_json

        if not isinstance(baseline, Mapping) and not isinstance(training_args, Mapping):
            args_path = Path(training_args) if training_args is not None else None
            kw: dict[str, Any] = {"world_size": world, "max_length": max_length}
            loaded.append(load_baseline(Path(baseline), args_path, **kw, transformers_version=transformers_version))
            return loaded[-1]
        first = (
            _mapping(baseline, "baseline")
            if isinstance(baseline, Mapping)
            else read_json(Path(baseline), "baseline file")
        )
        second = None
        if training_args is not None:
            second = (
                _mapping(training_args, "training_args")
                if isinstance(training_args, Mapping)
                else read_json(Path(training_args), "training-args file")
            )
        kind = file_kind(first)
        ds, hf = (first, second) if kind == "deepspeed" else (None, second) if kind == "accelerate" else (None, first)
        if second is not None and kind == "hf":
            raise BaselineError("two training-args given; pass one DeepSpeed JSON and one training-args JSON")
        accelerate = first if kind == "accelerate" else None
        version = transformers_version
        kw = {"world_size": world, "max_length": max_length, "transformers_version": version}
        loaded.append(parse_baseline(ds, hf, **kw, accelerate=accelerate))
        return loaded[-1]

    return load
