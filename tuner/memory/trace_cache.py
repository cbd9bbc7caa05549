"""The memory trace's points kept on disk (under the cache dir's ``traces/``), so a second `tuner explain` or
`tuner estimate` of the same model shape reads them in seconds instead of tracing for minutes (issue 40 §2).

One file per traced point. Its key: everything the tracer is asked beside the point (the model spec, label length,
LoRA, evaluation, padding, kernels, FSDP2 settings, training args: the request minus its points), the model's config
as it is on disk (a local directory's config.json, an HF id's cached snapshot), the point itself, the versions of
torch, transformers, deepspeed and peft, and the tracer's own code (a digest of trials/ and ``TRACKER_VERSION``).
Anything that changes what a point measures changes its key; a stale entry is never read, only left behind.

Reads are bounded (``MAX_ENTRY_BYTES``) and checked (the key it holds, the caller's validation): a torn, foreign or
corrupt file is a miss and is traced again; a cache that cannot be written is skipped. Never a crash."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

#: bump when the tracer measures a point differently in a way trials/'s digest would not show (it nearly always does)
TRACKER_VERSION = 1
MAX_ENTRY_BYTES = 4 << 20  # a point with its largest allocations is a few KiB
MAX_CONFIG_BYTES = 4 << 20
LIBRARIES = ("torch", "transformers", "deepspeed", "peft")
POINTS = "points"
FSDP_POINTS = "fsdp_points"
KINDS = (POINTS, FSDP_POINTS)
#: the model-wide numbers a trace reports beside its points (every point's run reports the same)
LISTS = (POINTS, FSDP_POINTS, "trace_s")

Validate = Callable[[str, Mapping[str, Any]], bool]  # (POINTS or FSDP_POINTS, a point's JSON) -> whether it reads


@functools.cache
def _versions() -> tuple[tuple[str, str | None], ...]:
    out: list[tuple[str, str | None]] = []
    for name in LIBRARIES:
        try:
            out.append((name, metadata.version(name)))
        except metadata.PackageNotFoundError:
            out.append((name, None))
    return tuple(out)


@functools.cache
def _tracer_digest() -> str:
    """A digest of the tracer's code (trials/*.py): a changed tracer traces anew."""
    root = Path(__file__).resolve().parents[2] / "trials"
    h = hashlib.sha256()
    for path in sorted(root.glob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def _bounded(path: Path, limit: int) -> bytes | None:
    try:
        with path.open("rb") as f:
            data = f.read(limit + 1)
    except OSError:
        return None
    return data if len(data) <= limit else None


def model_identity(model: Mapping[str, Any]) -> object:
    """What the traced model's shape comes from beyond its spec: a local directory's config.json (and its own
    modelling code), an HF id's cached snapshot (its path names the commit) and config; a built-in preset is its
    spec."""
    source = str(model.get("source") or "")
    if source.startswith("builtin:"):
        return None
    path = Path(source).expanduser()
    config: Path | None = path / "config.json" if path.is_dir() else None
    if config is None:
        with contextlib.suppress(Exception):  # an id: the cached snapshot, if any
            from huggingface_hub import try_to_load_from_cache

            found = try_to_load_from_cache(source, "config.json")
            config = Path(found) if isinstance(found, str) else None
    if config is None:
        return None
    files = [config, *sorted(config.parent.glob("*.py"))]  # a folder's own modelling code, where it has some
    return [[str(f), _digest(f)] for f in files]


def _digest(path: Path) -> str | None:
    data = _bounded(path, MAX_CONFIG_BYTES)
    return hashlib.sha256(data).hexdigest() if data is not None else None


def _key(parts: list[object]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:40]


@dataclass(frozen=True)
class TraceCache:
    """The cache directory's traced points (``dir``: the cache dir's ``traces/``)."""

    dir: Path

    def base(self, request: Mapping[str, Any]) -> str:
        """The key of everything but the points."""
        common = {k: v for k, v in request.items() if k not in KINDS}
        ident = model_identity(request.get("model") or {})
        return _key([TRACKER_VERSION, _tracer_digest(), list(_versions()), ident, common])

    def key(self, base: str, kind: str, point: Mapping[str, Any]) -> str:
        return _key([base, kind, point])

    def read(self, key: str) -> dict[str, Any] | None:
        """The entry of ``key``, None when absent, too large, torn or not its own."""
        data = _bounded(self.dir / f"{key}.json", MAX_ENTRY_BYTES)
        if data is None:
            return None
        try:
            entry = json.loads(data)
        except ValueError:
            return None
        ok = isinstance(entry, dict) and entry.get("key") == key
        return entry if ok and isinstance(entry.get("model"), dict) else None

    def write(self, key: str, model: Mapping[str, Any], point: Mapping[str, Any] | None) -> None:
        """Keeps an entry (atomically: a reader never sees half of it); a cache that cannot be written is skipped."""
        body = json.dumps({"key": key, "model": dict(model), "point": point})
        with contextlib.suppress(OSError):
            self.dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".tmp-", suffix=".json")
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(body)
                os.replace(tmp, self.dir / f"{key}.json")
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)


@dataclass(frozen=True)
class Lookup:
    """What the cache holds of a request: the points found (by kind and index), the model-wide numbers, the request
    for the rest (None: nothing to trace)."""

    found: dict[tuple[str, int], dict[str, Any]]
    model: dict[str, Any] | None
    rest: dict[str, Any] | None
    keys: dict[tuple[str, int], str]
    base: str

    @property
    def hits(self) -> int:
        return len(self.found)


def look_up(cache: TraceCache, request: Mapping[str, Any], valid: Validate) -> Lookup:
    base = cache.base(request)
    keys = {(kind, i): cache.key(base, kind, p) for kind in KINDS for i, p in enumerate(request.get(kind) or [])}
    found: dict[tuple[str, int], dict[str, Any]] = {}
    model: dict[str, Any] | None = None
    for (kind, i), key in keys.items():
        entry = cache.read(key)
        if entry is not None and isinstance(entry.get("point"), dict) and valid(kind, entry["point"]):
            found[(kind, i)] = entry["point"]
            model = entry["model"]
    if not keys:  # the model's numbers alone
        entry = cache.read(cache.key(base, "model", {}))
        model = entry["model"] if entry is not None else None
    missing = {kind: [p for i, p in enumerate(request.get(kind) or []) if (kind, i) not in found] for kind in KINDS}
    rest = None
    if any(missing.values()) or model is None:
        rest = {**request, **missing}
    return Lookup(found, model, rest, keys, base)


def merged(
    cache: TraceCache, request: Mapping[str, Any], looked: Lookup, traced: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The whole trace of ``request``: the points found and those just ``traced`` (the rest's answer, kept in the
    cache), in the request's order."""
    model = dict(looked.model or {})
    fresh: dict[str, list[dict[str, Any]]] = {POINTS: [], FSDP_POINTS: []}
    if traced is not None:
        model = {k: v for k, v in traced.items() if k not in LISTS}
        fresh = {kind: list(traced.get(kind) or []) for kind in KINDS}
        cache.write(cache.key(looked.base, "model", {}), model, None)
    out: dict[str, Any] = {**model, "trace_s": float((traced or {}).get("trace_s") or 0.0)}
    for kind in KINDS:
        taken = iter(fresh[kind])
        points = []
        for i, _ in enumerate(request.get(kind) or []):
            if (kind, i) in looked.found:
                points.append(looked.found[(kind, i)])
            else:
                point = next(taken)
                cache.write(looked.keys[(kind, i)], model, point)
                points.append(point)
        out[kind] = points
    return out


def here() -> TraceCache | None:
    """The cache under the settings' cache dir; None when the settings cannot be read."""
    from tuner.errors import TunerError
    from tuner.settings import load_settings

    try:
        return TraceCache(load_settings().cache_dir / "traces")
    except TunerError:
        return None


def same_python(python: str | None) -> bool:
    """Only a trace run by this interpreter is cached (the versions in the key are this environment's)."""
    return python is None or os.path.realpath(python) == os.path.realpath(sys.executable)
