"""The GPU check's crash line: the team's config at their worst batch (trial 0 of the crash study) ran out of memory
and recorded the allocation it was refused; on a GPU, of the size their OOM text names (4.81 GiB: the attention
scores of 2 x 16 heads x 6,352^2 in fp32), within 1%.

    python3 -m benchmarks.gpu.crash_check STORAGE STUDY [EXPECTED_GIB]
"""

from __future__ import annotations

import sys

from benchmarks.gpu.verdict import Check, report
from tuner.storage import Store

GiB = 2**30


def main() -> int:
    storage, study = sys.argv[1], sys.argv[2]
    expected = float(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[3] else None
    rows = [r for r in Store(storage, read_only=True).probes(study) if r.trial_number == 0]
    if not rows:
        return report([Check("the team's config at its worst batch", "not probed", "an OOM with its record", False)])
    row = rows[0]
    failed = [f for rank in row.measurement.ranks if (f := rank.failed_allocation) is not None]
    said = "; ".join(
        f"refused {f.nbytes / GiB:.2f} GiB in {f.phase}/{f.stage} ({f.op}, {f.live / GiB:.2f} GiB in use)"
        for f in failed
    )
    print(f"crash: trial 0 at the worst batch: {row.status}, {said or 'no refused allocation recorded'}")
    checks = [
        Check(
            "the team's config at its worst batch",
            f"{row.status}, {len(failed)} refused allocation(s) recorded",
            "an OOM with its record",
            row.status == "oom" and bool(failed),
        )
    ]
    if expected is not None:
        sizes = ", ".join(f"{f.nbytes / GiB:.2f} GiB" for f in failed) or "none"
        near = any(abs(f.nbytes / GiB - expected) <= 0.01 * expected for f in failed)
        checks.append(Check("the refused allocation", sizes, f"their {expected:g} GiB within 1%", near))
    return report(checks)


if __name__ == "__main__":
    sys.exit(main())
