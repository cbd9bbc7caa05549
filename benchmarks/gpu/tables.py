"""The GPU check's tables, in one process (each a module's ``main`` with its own arguments): the probe table without
the estimate column (benchmarks.gpu.probe_table --no-estimate), the OOM records, the crash line, the Trainer's
verdict. Every line on stdout; exit 1 when any of them failed a check.

    python3 -m benchmarks.gpu.tables STORAGE MAX_FIXED_S MIN_PROBES TRAINER_JSON STEPS [CRASH_GIB]
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from benchmarks.gpu import crash_check, judge, oom_record, probe_table
from benchmarks.gpu.commands import CRASH_STUDY, SEARCH_STUDY


def _run(main: Callable[[], int], argv: list[str]) -> int:
    sys.argv = ["tables", *argv]
    try:
        return main()
    except Exception as exc:  # one table that cannot be read is a line; the others still print
        print(f"check {main.__module__}: could not be read ({type(exc).__name__}: {exc}), target a table: FAIL")
        return 1
    finally:
        sys.stdout.flush()


def main() -> int:
    storage, max_fixed, min_probes, trainer, steps = sys.argv[1:6]
    crash_gib = sys.argv[6] if len(sys.argv) > 6 else ""
    codes = [
        _run(probe_table.main, [storage, SEARCH_STUDY, max_fixed, min_probes, "--no-estimate"]),
        _run(oom_record.main, [storage, SEARCH_STUDY]),
        _run(crash_check.main, [storage, CRASH_STUDY, crash_gib]),
        _run(judge.main, [storage, SEARCH_STUDY, trainer, steps]),
    ]
    return 1 if any(codes) else 0


if __name__ == "__main__":
    sys.exit(main())
