"""The CUDA arch list DeepSpeed's op builds and probes get (pure, tested on CPU; the capabilities come from NVML at
the edge, ``tuner.probing.gpus.gpu_capability``).

GPU images name arch-specific targets with a suffix: Hopper's "9.0a", Blackwell's "10.0a" (and CUDA 12.9's family
targets "10.0f"). DeepSpeed 0.19.0-0.19.8 parses every TORCH_CUDA_ARCH_LIST entry with int() in
``CUDAOpBuilder.compute_capability_args`` and fails on them ("invalid literal for int() with base 10: '0a'"), so
every op build and every probe that loads FusedAdam failed on an H200. The subprocesses that build and load ops get a
list DeepSpeed parses: the user's entries without the suffix ("+PTX" kept), else the visible devices' capabilities.
The user's own environment is left alone; the list used is recorded with each probe (its fingerprint's
``cuda_arch_list``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

ARCH_ENV = "TORCH_CUDA_ARCH_LIST"
_ENTRY = re.compile(r"(\d+)\.(\d+)[a-z]?(\+PTX)?", re.IGNORECASE)


def parseable_arch_list(user: str | None, capabilities: Sequence[tuple[int, int]] = ()) -> str | None:
    """A TORCH_CUDA_ARCH_LIST that DeepSpeed's builder parses: ``user``'s entries ("9.0a;10.0a+PTX", ";" or white
    space apart) as major.minor without the arch-specific suffix, "+PTX" kept, in order, each once; entries that are no
    version (torch's names, "Hopper") are dropped. With no usable entry: the ``capabilities`` given (the visible
    devices', "9.0"), else None (nothing to set: DeepSpeed then probes the device itself)."""
    out: dict[str, bool] = {}
    for entry in re.split(r"[;\s]+", (user or "").strip()):
        match = _ENTRY.fullmatch(entry)
        if match:
            key = f"{int(match[1])}.{int(match[2])}"
            out[key] = out.get(key, False) or match[3] is not None
    if not out:
        for major, minor in capabilities:
            out.setdefault(f"{major}.{minor}", False)
    return ";".join(f"{key}{'+PTX' if ptx else ''}" for key, ptx in out.items()) or None


def needs_rewrite(user: str | None) -> bool:
    """Whether ``user``'s list holds an entry DeepSpeed's builder cannot parse (a suffix, a name)."""
    entries = [e for e in re.split(r"[;\s]+", (user or "").strip()) if e]
    return any(not re.fullmatch(r"\d+\.\d+(\+PTX)?", e) for e in entries)
