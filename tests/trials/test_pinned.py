"""The offloaded setup's pinned-memory variants (issue 41 §4; trials.contract_pinned, trials.pinned,
trials.alloc_settings): the variant's name and its parsing, the allocator settings each puts in force and takes back
(through this torch's own setter, read back by its getter, in a forked child so this process keeps its settings), and
the in-place pinning at the exact size around DeepSpeed's accelerator. cudaHostRegister itself needs CUDA: where the
in-place pinning is exercised here, a registrar stands in for it (the GPU check runs the real one)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from trials import alloc_settings
from trials.contract import (
    PINNED_ALLOC_ENV,
    parse_pinned_alloc,
    pinned_alloc_text,
    register_threads,
)
from trials.pinned import PinnedLedger, exact_pinning, pinned_setup, with_host_register, without_host_register
from tuner.probing.environment import probe_env
from tuner.settings import SettingsError, load_settings


def test_the_variants_parse_and_a_bad_one_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_pinned_alloc("deepspeed") == ("deepspeed", None)
    assert parse_pinned_alloc(" Register:8 ") == ("register", 8)
    assert parse_pinned_alloc("exact") == ("exact", None)
    for bad in ("pinned", "register:3", "register:256", "register:x", "exact:4", "register:0"):
        with pytest.raises(ValueError) as err:
            parse_pinned_alloc(bad)
        assert "\n" not in str(err.value) and bad.strip() in str(err.value)
    monkeypatch.setenv(PINNED_ALLOC_ENV, "fast")
    with pytest.raises(SettingsError, match="TUNER_PINNED_ALLOC='fast' is not valid"):
        load_settings()


def test_register_gets_a_power_of_two_of_threads_from_the_cores() -> None:
    assert [register_threads(n) for n in (1, 2, 3, 12, 16, 64)] == [1, 2, 2, 8, 16, 16]
    assert pinned_alloc_text("register", cores=12) == "register:8"
    assert pinned_alloc_text("register:32", cores=2) == "register:32"  # asked for: as asked
    assert pinned_alloc_text("exact", cores=16) == "exact"


def test_the_probe_environment_carries_the_setting_never_the_users_shell() -> None:
    """The ranks read the variant from PINNED_ALLOC_ENV; the runner writes it from its settings (the default where
    unset), whatever the environment it started from held."""
    base = {"PATH": "/usr/bin", PINNED_ALLOC_ENV: "exact"}
    assert probe_env(1, base=base, settings=load_settings(pinned_alloc="deepspeed"))[PINNED_ALLOC_ENV] == "deepspeed"
    threads = register_threads(os.cpu_count() or 1)
    got = probe_env(1, base=base, settings=load_settings(pinned_alloc="register"))
    assert got[PINNED_ALLOC_ENV] == f"register:{threads}"


def test_the_allocator_string_goes_back_to_torchs_defaults_for_what_it_leaves_out() -> None:
    assert alloc_settings.keys("expandable_segments:True,roundup_power2_divisions:[256:1,>:4]") == [
        "expandable_segments",
        "roundup_power2_divisions",
    ]
    assert alloc_settings.switch("expandable_segments:True", "") == "expandable_segments:False"
    assert alloc_settings.switch("", "expandable_segments:True") == "expandable_segments:True"
    # max_split_size_mb is reset by torch's own parse: nothing to say for it
    assert alloc_settings.switch("max_split_size_mb:64", "garbage_collection_threshold:0.6") == (
        "garbage_collection_threshold:0.6"
    )
    mine = "expandable_segments:True"
    assert with_host_register(mine, 8) == (
        "expandable_segments:True,pinned_use_cuda_host_register:True,pinned_num_register_threads:8"
    )
    assert without_host_register(mine, 8) == (
        "expandable_segments:True,pinned_use_cuda_host_register:False,pinned_num_register_threads:1"
    )
    theirs = "pinned_use_cuda_host_register:True,pinned_num_register_threads:4"  # the user's own: kept as theirs
    assert without_host_register(theirs, 8) == theirs


def _in_fork(tmp_path: Path, body: Callable[[], object]) -> object:
    """``body()`` in a forked child of this process; its JSON result."""
    out = tmp_path / "child.json"
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            out.write_text(json.dumps(body()))
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return json.loads(out.read_text())


@pytest.mark.skipif(alloc_settings.getter(torch._C) is None, reason="this torch cannot read the settings back")
def test_register_is_in_force_during_the_setup_only(tmp_path: Path) -> None:
    """Through this torch's own setter (the one torch 2.11 has), read back by its getter."""
    getter = alloc_settings.getter(torch._C)
    assert getter is not None
    env = {PINNED_ALLOC_ENV: "register:8", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}

    def body() -> object:
        seen = []
        with pinned_setup(True, env) as ledger:
            seen.append(getter())
        seen.append(getter())
        return [ledger.variant, *seen]

    variant, during, after = _in_fork(tmp_path, body)  # type: ignore[misc]
    assert variant == "register:8"
    assert during == "expandable_segments:True,pinned_use_cuda_host_register:True,pinned_num_register_threads:8"
    assert after == "expandable_segments:True,pinned_use_cuda_host_register:False,pinned_num_register_threads:1"


def test_without_cuda_or_with_the_default_nothing_changes(tmp_path: Path) -> None:
    def body() -> object:
        before = _read()
        with pinned_setup(False, {PINNED_ALLOC_ENV: "register:8"}) as off:
            during_off = _read()
        with pinned_setup(True, {PINNED_ALLOC_ENV: "deepspeed"}) as default:
            during_default = _read()
        with pinned_setup(True, {PINNED_ALLOC_ENV: "nonsense"}) as unreadable:
            pass
        return [before == during_off == during_default, off.parts(), default.variant, unreadable.variant]

    same, parts, default, unreadable = _in_fork(tmp_path, body)  # type: ignore[misc]
    assert same is True and parts == {} and default == "deepspeed" and unreadable == "deepspeed"


def _read() -> str | None:
    getter = alloc_settings.getter(torch._C)
    return getter() if getter is not None else None


def test_exact_pins_deepspeeds_buffers_in_place_at_their_size() -> None:
    """DeepSpeed's own accelerator object, its pin_memory replaced inside and back after; each buffer registered where
    it is at its byte size (no power-of-two rounding, no copy); a refusal falls back to DeepSpeed's pin_memory."""
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    registered: list[tuple[int, int]] = []
    refuse = {"next": False}

    def registrar(ptr: int, nbytes: int) -> bool:
        if refuse["next"]:
            return False
        registered.append((ptr, nbytes))
        return True

    fp32 = torch.zeros(3_000_001)  # 12,000,004 bytes: torch's host allocator would take 16 MiB
    strided = torch.zeros(10, 4).t()
    ledger = PinnedLedger(variant="exact")
    with exact_pinning(ledger, registrar):
        pinned = accelerator.pin_memory(fp32)
        made = accelerator.pin_memory(strided)
        template = accelerator.pin_memory(torch.zeros(5), make_copy=False)
        refuse["next"] = True
        fell_back = accelerator.pin_memory(torch.ones(7))
    assert "pin_memory" not in vars(accelerator)  # the class's method again
    assert pinned.data_ptr() == fp32.data_ptr()  # in place: the same memory, no copy
    assert registered[0] == (fp32.data_ptr(), 12_000_004)
    assert made.is_contiguous() and registered[1][1] == 40 * 4 and torch.equal(made, strided.contiguous())
    assert template.shape == (5,) and len(registered) == 2  # a template for a fresh buffer: DeepSpeed's own way
    assert torch.equal(fell_back, torch.ones(7)) and ledger.fallbacks == 1
    assert ledger.parts() == {"pinned_alloc": ledger.seconds, "pinned_gib": (12_000_004 + 160) / 2**30}
