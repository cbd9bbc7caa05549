"""The caching allocators' settings changed at run time (pure): the string torch's setter needs to go from the
settings in force to the ones asked, and which setter this torch has.

torch parses ``PYTORCH_CUDA_ALLOC_CONF`` once, at import; a forked probe rank (trials.forkserver) and the pinned
variants (trials.pinned) change them later with ``torch._C._accelerator_setAllocatorSettings`` (torch >= 2.9; torch
2.11 has the setter without ``_accelerator_getAllocatorSettings``). That parse resets only max_split_size_mb,
roundup_power2_divisions and garbage_collection_threshold when a string leaves them out (c10 AllocatorConfig::
parseArgs): every other key keeps its last value, so going from "expandable_segments:True" to "" needs
"expandable_segments:False" said."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: torch's defaults of the keys its parse keeps when a string leaves them out (``backend`` cannot change after import)
KEPT_DEFAULTS: dict[str, str] = {
    "expandable_segments": "False",
    "release_lock_on_cudamalloc": "False",
    "max_non_split_rounding_mb": "20",
    "pinned_use_cuda_host_register": "False",
    "pinned_num_register_threads": "1",
    "pinned_use_background_threads": "False",
}


def keys(conf: str) -> list[str]:
    """The option names of a settings string, in order ("a:1,b:[1:2]" -> a, b); brackets hold no names."""
    out, depth, token = [], 0, ""
    for ch in conf + ",":
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            name = token.split(":", 1)[0].strip()
            if name:
                out.append(name)
            token = ""
            continue
        token += ch
    return out


def switch(in_force: str, asked: str) -> str:
    """The string that takes the allocator from ``in_force`` to ``asked``: ``asked``, then torch's default of each
    kept key ``in_force`` names and ``asked`` does not."""
    named = set(keys(asked))
    back = [f"{k}:{KEPT_DEFAULTS[k]}" for k in keys(in_force) if k in KEPT_DEFAULTS and k not in named]
    return ",".join(([asked] if asked else []) + list(dict.fromkeys(back)))


def setter(torch_c: Any) -> Callable[[str], None] | None:
    """This torch's run-time setter (``torch._C`` given), None before torch 2.9."""
    found = getattr(torch_c, "_accelerator_setAllocatorSettings", None)
    return found if callable(found) else None


def getter(torch_c: Any) -> Callable[[], str] | None:
    """This torch's getter of the settings in force, None where it has none (torch 2.11, and before 2.9)."""
    found = getattr(torch_c, "_accelerator_getAllocatorSettings", None)
    return found if callable(found) else None


__all__ = ["KEPT_DEFAULTS", "getter", "keys", "setter", "switch"]
