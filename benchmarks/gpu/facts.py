"""What the GPU check's driver needs to know of the study database, as one JSON line:

    python3 -m benchmarks.gpu.facts STORAGE

``oom_trial``: the search's first probe that ran out of memory with a recorded failure (its trial number), and
``oom_snapshot`` its CUDA memory snapshot (a path; None without one, as on the emulated device); ``crash_snapshot``
the crash study's (trial 0); ``probes``: probes the search launched (a refused one measured nothing: not counted).
"""

from __future__ import annotations

import json
import sys

from trials.contract import Status
from tuner.records import ProbeRow
from tuner.storage import Store


def launched(rows: list[ProbeRow]) -> list[ProbeRow]:
    """The probes that ran (a measured fidelity, not refused before launching): what a probe count counts."""
    return [r for r in rows if r.measured and r.status != Status.REFUSED]


def first_oom(rows: list[ProbeRow]) -> tuple[int | None, str | None]:
    """The first probe that ran out of memory and recorded its failed allocation: its trial and snapshot."""
    for r in launched(rows):
        if r.status != Status.OOM or r.trial_number is None:
            continue
        recorded = [rank for rank in r.measurement.ranks if rank.failed_allocation is not None]
        if recorded:
            return r.trial_number, next((rank.snapshot for rank in recorded if rank.snapshot), None)
    return None, None


def facts(storage: str) -> dict[str, object]:
    store = Store(storage, read_only=True)
    search, crash = store.probes("gpu-check"), store.probes("crash")
    trial, snapshot = first_oom(search)
    _, crash_snapshot = first_oom(crash)
    return {
        "oom_trial": trial,
        "oom_snapshot": snapshot,
        "crash_snapshot": crash_snapshot,
        "probes": len(launched(search)),
    }


def main() -> int:
    print(json.dumps(facts(sys.argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
