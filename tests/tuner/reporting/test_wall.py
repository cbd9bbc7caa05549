"""Where the wall draws an out-of-memory probe (tuner.reporting.wall): at what it needed, in use + the refused
allocation, from RankMemory.oom_need (the emulated device) or its FailedAllocation alone (CUDA's observer records
only that); at its pre-failure peak only when it recorded neither, and says so."""

from __future__ import annotations

from typing import Any

from tuner.records import Fidelity, ProbeRow, ProbeStatus
from tuner.reporting.wall import memory_of, points

MiB = 1 << 20


def oom(rank: dict[str, Any], key: str = "k") -> ProbeRow:
    return ProbeRow(
        key,
        Fidelity.SHORT,
        ProbeStatus.OOM,
        {"micro_batch_size": 8},
        {},
        trial_number=3,
        peak_allocated=8 * MiB,
        result={"status": "oom", "ranks": [{"rank": 0, "peak_allocated": 8 * MiB, **rank}]},
        id=1,
    )


def test_an_oom_is_drawn_at_in_use_plus_the_refused_allocation() -> None:
    refused = {"nbytes": 381 * MiB, "live": 8 * MiB, "capacity": 64 * MiB}
    assert memory_of(oom({"failed_allocation": refused})) == 389 * MiB  # CUDA: the observer's record only
    assert memory_of(oom({"oom_need": 389 * MiB})) == 389 * MiB  # the emulated device's sum
    assert memory_of(oom({})) == 8 * MiB  # nothing recorded: the peak, and the hover says so
    (drawn,) = points([oom({"failed_allocation": refused})])
    assert (drawn.kind, drawn.mib, drawn.value) == ("oom", 389.0, 0.0)
    assert "t3 micro=8" in drawn.text and "needed at least 389.0 MiB" in drawn.text
    (bare,) = points([oom({})])
    assert bare.mib == 8.0 and "no refused allocation recorded" in bare.text
