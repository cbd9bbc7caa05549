"""FSDP2's storage resizes, counted by the emulated device.

FSDP2 keeps each unsharded parameter's tensor for the model's life and frees / re-allocates its storage in place
(``untyped_storage().resize_``: ``alloc_storage`` before a block's all-gather copy-out, ``free_storage`` at its
reshard). A storage resize runs outside the dispatcher, so the live-tensor tracker would not see it: while a tracker
is active these two functions of the installed torch are wrapped to recount the storage after each resize (a growth
past the capacity raises torch.OutOfMemoryError, as CUDA's allocator would).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

# (module, function) pairs of torch's FSDP2 that resize a storage in place; a module imports alloc_storage by name
_RESIZERS: tuple[tuple[str, str], ...] = (
    ("torch.distributed.fsdp._fully_shard._fsdp_param", "alloc_storage"),
    ("torch.distributed.fsdp._fully_shard._fsdp_param", "free_storage"),
    ("torch.distributed.fsdp._fully_shard._fsdp_param_group", "alloc_storage"),
)


@contextlib.contextmanager
def counted_resizes(recount: Callable[[torch.Tensor], Any]) -> Iterator[None]:
    """Inside: each FSDP2 storage resize calls ``recount(tensor)`` after it (a torch without FSDP2: nothing to do)."""
    saved: list[tuple[Any, str, Any]] = []
    try:
        for module_name, name in _RESIZERS:
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue
            original = getattr(module, name, None)
            if original is None:
                continue

            def counted(tensor: torch.Tensor, _original: Any = original) -> None:
                _original(tensor)
                recount(tensor)

            saved.append((module, name, original))
            setattr(module, name, counted)
        yield
    finally:
        for module, name, original in saved:
            setattr(module, name, original)
