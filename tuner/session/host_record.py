"""What a study's measurements depend on beyond its definition: the GPU (type, count, memory) and the library versions
(torch, DeepSpeed, transformers, CUDA) of the hosts that probe it. Stored once in the study's definition (``host``)
by its first worker, before its first probe; every worker that joins or resumes the study compares it with its own
host, so a study never silently mixes measurements of two setups (issue 13, point 11).

A study stored before this record existed, with probe rows already, has none: it resumes as before, with no
comparison (the GPU type is still checked against its first probe, tuner.probing.gpus.fingerprint_refusal). A study
with no probe row yet (e.g. defined through ``POST /studies``) gets the record of the first worker that joins it.

Pure: HostRecord and ``mismatch``. At the edge: ``this_host`` (NVML and package metadata, no torch import, no CUDA
context in the tuner's process) and ``check_host_record`` (the store)."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from tuner.errors import ConfigError
from tuner.storage import Store

#: the definition key the record is stored under
KEY = "host"
#: compared on resume, in this order, with the words a message names them by; gpu_count is recorded, not compared (a
#: probe uses world_size GPUs, already part of the definition, whatever else the host has)
COMPARED = {
    "gpu_name": "GPU",
    "gpu_memory": "GPU memory",
    "torch": "torch",
    "deepspeed": "deepspeed",
    "transformers": "transformers",
    "cuda": "CUDA",
}
#: not compared when the study's device memory is fixed (--device-memory): every worker then searches the same
#: budget, as tuner.probing.gpus.fingerprint_refusal allows
DEVICE_FIELDS = ("gpu_name", "gpu_memory")
_CUDA = re.compile(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]*)['\"]", re.MULTILINE)


@dataclass(frozen=True)
class HostRecord:
    gpu_name: str  # "" on a host without a GPU
    gpu_count: int  # GPUs visible to this worker
    gpu_memory: int | None  # bytes of the first visible GPU (NVML's total); None where unknown
    torch: str  # package versions, "absent" when not installed
    deepspeed: str
    transformers: str
    cuda: str  # the CUDA torch was built with; "" for a CPU build

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _shown(field: str, value: Any) -> str:
    if value in (None, ""):
        return "none"
    if field == "gpu_memory":
        return f"{int(value) / (1 << 30):.1f} GiB"
    return str(value)


def mismatch(study: str, stored: Mapping[str, Any], here: HostRecord, device_memory_given: bool) -> str | None:
    """The one line refusing this host for ``study`` (the first compared field that differs, both values, what to
    do), or None when its measurements would be comparable. A field the stored record lacks (a record from an older
    tuner) or that is unknown on either side (GPU memory without NVML) is not compared."""
    ours = here.to_dict()
    for field, words in COMPARED.items():
        if field not in stored or (device_memory_given and field in DEVICE_FIELDS):
            continue
        theirs, mine = stored[field], ours[field]
        if field == "gpu_memory" and (theirs is None or mine is None):
            continue
        if theirs != mine:
            return (
                f"study {study!r} was measured with {words} {_shown(field, theirs)} but this host has "
                f"{_shown(field, mine)}: its results would mix two setups' measurements; use a new --study "
                f"(or run this worker where {words} is {_shown(field, theirs)})"
            )
    return None


# -- the edge --------------------------------------------------------------------------------------------------------
def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "absent"


def torch_cuda() -> str:
    """The CUDA version torch was built with (torch.version.cuda), read from torch's version.py: importing torch would
    cost the tuner's process seconds. "" for a CPU build or without torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return ""
    try:
        text = (Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text(encoding="utf-8")
    except OSError:
        return ""
    found = _CUDA.search(text)
    return found.group(1) if found else ""


def this_host() -> HostRecord:
    """This worker's record: its first visible GPU (NVML, no CUDA context) and the installed versions."""
    from tuner.probing import gpus

    visible, physical, _ = gpus.host_visible_devices()
    on_gpu = bool(physical and visible)
    index = gpus.first_visible_index(visible)
    return HostRecord(
        gpu_name=gpus.gpu_name(index) if on_gpu else "",
        gpu_count=len(visible) if on_gpu else 0,
        gpu_memory=gpus.gpu_memory(index) if on_gpu else None,
        torch=_version("torch"),
        deepspeed=_version("deepspeed"),
        transformers=_version("transformers"),
        cuda=torch_cuda(),
    )


def check_host_record(
    store: Store, study: str, device_memory_given: bool, resumed: bool, here: HostRecord | None = None
) -> bool:
    """Before the first probe of this worker: records this host on a study that has no record and no probe row yet
    (the first worker of a new study, or of one defined through the API), else compares it with the stored record.
    ConfigError with one line naming the field when they differ. False for a study from before the record (probe
    rows, no record): it resumes as before, and only its first probe's GPU type can be compared."""
    here = here or this_host()
    definition = store.definition(study)
    stored = definition.host if definition is not None else None
    if stored is None:
        if resumed and store.probes(study, limit=1):
            return False
        stored = store.record_in_definition(study, KEY, here.to_dict())  # another worker's, when it came first
    line = mismatch(study, stored, here, device_memory_given)
    if line:
        raise ConfigError(line)
    return True


__all__ = ["KEY", "HostRecord", "check_host_record", "mismatch", "this_host", "torch_cuda"]
