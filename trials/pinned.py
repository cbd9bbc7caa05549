"""The pinned host memory of a probe's engine setup, in the variant the runner chose for the probe's environment
(trials.contract_pinned: ``deepspeed``, ``register:N``, ``exact``; issue 41 §4).

``deepspeed.initialize`` with CPU optimizer offload and ``pin_memory`` pins the fp32 master partition, its gradient
and a bf16 staging buffer (about 10 GiB for flan-t5-large: 13.7 s of the H200's 14.2 s fixed cost). Only that setup
changes: the variant is in force inside ``pinned_setup`` (around ``deepspeed.initialize``) and gone after it, so the
probe's steps run as the user's do; the user's export never carries it. On a host without CUDA nothing is pinned
(the emulated device turns ``pin_memory`` off) and every variant is the same setup.

The decisions are pure and tested on CPU (``with_host_register``, ``without_host_register``); the edges are torch's
allocator-settings setter (``set_allocator_settings``) and CUDA's cudaHostRegister (``cuda_register``)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from trials import alloc_settings
from trials.contract import (
    DEFAULT_PINNED_ALLOC,
    PINNED_ALLOC_ENV,
    alloc_conf_in_force,
    parse_pinned_alloc,
    register_threads,
)

REGISTER_KEY = "pinned_use_cuda_host_register"
THREADS_KEY = "pinned_num_register_threads"
#: registers ``nbytes`` at address ``ptr`` in place (cudaHostRegister); True when the memory is page-locked now
Registrar = Callable[[int, int], bool]


def with_host_register(alloc_conf: str, threads: int) -> str:
    """The allocator settings of the ``register`` variant: the rank's own (``alloc_conf``, the knob or the user's
    shell) first, then torch's host-register pinning with ``threads`` threads (a later key wins in torch's parse)."""
    ours = f"{REGISTER_KEY}:True,{THREADS_KEY}:{threads}"
    return f"{alloc_conf},{ours}" if alloc_conf else ours


def without_host_register(alloc_conf: str, threads: int) -> str:
    """The settings that put the rank's own (``alloc_conf``) back after the setup: the pinning keys it does not name
    back at torch's defaults (trials.alloc_settings.switch), its own as they were."""
    return alloc_settings.switch(with_host_register(alloc_conf, threads), alloc_conf)


def set_allocator_settings(conf: str) -> None:
    """Puts ``conf`` in force now: torch >= 2.9's accelerator setter (torch 2.11 has it, without the getter), else
    torch.cuda's older one."""
    setter = alloc_settings.setter(torch._C) or torch.cuda.memory._set_allocator_settings
    setter(conf)


def cuda_register(ptr: int, nbytes: int) -> bool:
    """cudaHostRegister(ptr, nbytes, cudaHostRegisterDefault): page-locks that memory where it is."""
    return int(torch.cuda.cudart().cudaHostRegister(ptr, nbytes, 0)) == 0


@dataclass
class PinnedLedger:
    """What the variant did during the setup: ``exact``'s registrations (their seconds and bytes; the tensors kept
    alive, since memory freed while registered must not go back to the heap) and the ones CUDA refused, which fell
    back to DeepSpeed's own pinning."""

    variant: str = DEFAULT_PINNED_ALLOC
    seconds: float = 0.0
    nbytes: int = 0
    fallbacks: int = 0
    kept: list[torch.Tensor] = field(default_factory=list)

    def parts(self) -> dict[str, float]:
        """The engine's setup parts ``exact`` adds (torch's host-allocator stats do not see memory pinned in place):
        "pinned_alloc" seconds and "pinned_gib"; empty for the other variants."""
        if not self.kept:
            return {}
        return {"pinned_alloc": self.seconds, "pinned_gib": self.nbytes / 2**30}

    def pin(self, tensor: torch.Tensor, register: Registrar, fallback: Callable[[torch.Tensor], torch.Tensor]) -> Any:
        """``tensor`` page-locked in place at its exact size (a non-contiguous one is made contiguous first); where
        CUDA refuses, ``fallback`` (DeepSpeed's pin_memory)."""
        if tensor.is_pinned():
            return tensor
        own = tensor.contiguous()
        nbytes = own.untyped_storage().nbytes()
        start = time.monotonic()
        if nbytes == 0 or not register(own.untyped_storage().data_ptr(), nbytes):
            self.fallbacks += 1
            return fallback(tensor)
        self.seconds += time.monotonic() - start
        self.nbytes += nbytes
        self.kept.append(own)
        return own


@contextlib.contextmanager
def exact_pinning(ledger: PinnedLedger, register: Registrar = cuda_register) -> Iterator[PinnedLedger]:
    """DeepSpeed's accelerator pins in place while inside (its ``pin_memory`` replaced on the accelerator object)."""
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    original = accelerator.pin_memory

    def pin_exact(tensor: torch.Tensor, make_copy: bool = True, match_shape: bool = True) -> Any:
        if not make_copy or not match_shape:  # a template for a fresh buffer of its shape: DeepSpeed's own way
            return original(tensor, make_copy=make_copy, match_shape=match_shape)
        return ledger.pin(tensor, register, original)

    accelerator.pin_memory = pin_exact
    try:
        yield ledger
    finally:
        del accelerator.pin_memory  # the class's method again


@contextlib.contextmanager
def pinned_setup(cuda: bool, env: dict[str, str] | None = None) -> Iterator[PinnedLedger]:
    """The engine's setup under the variant of the rank's environment (``PINNED_ALLOC_ENV``; unset or unreadable:
    ``deepspeed``); on CUDA only."""
    env = dict(os.environ) if env is None else env
    try:
        kind, threads = parse_pinned_alloc(env.get(PINNED_ALLOC_ENV) or DEFAULT_PINNED_ALLOC)
    except ValueError:
        kind, threads = DEFAULT_PINNED_ALLOC, None
    ledger = PinnedLedger(variant=kind if threads is None else f"{kind}:{threads}")
    if not cuda or kind == DEFAULT_PINNED_ALLOC:
        yield ledger
    elif kind == "exact":
        with exact_pinning(ledger):
            yield ledger
    else:
        own = alloc_conf_in_force(env) or ""
        threads = threads or register_threads(os.cpu_count() or 1)
        set_allocator_settings(with_host_register(own, threads))
        try:
            yield ledger
        finally:
            set_allocator_settings(without_host_register(own, threads))


__all__ = [
    "PinnedLedger",
    "cuda_register",
    "exact_pinning",
    "pinned_setup",
    "set_allocator_settings",
    "with_host_register",
    "without_host_register",
]


def pinned_parts(stats: Mapping[str, Any]) -> dict[str, float]:
    """The pinned host memory an engine's setup allocated, from torch.cuda.host_memory_stats (pure): the seconds in
    CUDA's pinned allocations ("pinned_alloc") and their GiB ("pinned_gib"); empty where the torch reports neither."""
    out: dict[str, float] = {}
    micros = stats.get("host_alloc_time.total")
    if isinstance(micros, (int, float)):
        out["pinned_alloc"] = micros / 1e6
    peak = stats.get("allocated_bytes.peak")
    if isinstance(peak, (int, float)):
        out["pinned_gib"] = peak / 2**30
    return out
