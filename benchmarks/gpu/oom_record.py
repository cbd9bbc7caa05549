"""The GPU check's OOM record line (issue 22 §1): every probe of the study that ran out of memory recorded the
allocation it was refused (size, phase, bytes in use) and, on CUDA, a memory snapshot file that exists (for
pytorch.org/memory_viz; `tuner explain --study S --trial N` names it). Exits 1 when OOM probes ran and none has its
record (one without may be an OOM the caching allocator did not see: a cuBLAS handle, NCCL).

    python3 -m benchmarks.gpu.oom_record STORAGE STUDY
"""

from __future__ import annotations

import sys
from pathlib import Path

from benchmarks.gpu.verdict import Check, report
from tuner.storage import Store

MiB = 2**20


def main() -> int:
    storage, study = sys.argv[1], sys.argv[2]
    ooms, recorded = [], []
    for r in Store(storage, read_only=True).probes(study):
        if not r.measured or r.status != "oom":
            continue
        for rank in r.measurement.ranks:
            f, snap = rank.failed_allocation, rank.snapshot
            cuda = r.measurement.fingerprint.get("device") == "cuda"
            size = f"{Path(snap).stat().st_size / MiB:,.1f} MiB" if snap and Path(snap).is_file() else "none"
            where = "-" if f is None else f"{f.nbytes / MiB:,.1f} MiB in {f.phase}/{f.stage}"
            where += "" if f is None else f", {f.live / MiB:,.0f} MiB in use"
            print(f"oom record: trial {r.trial_number} rank {rank.rank}: refused {where}; snapshot {snap} ({size})")
            ooms.append(rank)
            if f is not None and (not cuda or size != "none"):
                recorded.append(rank)
    what = "OOM probes with their failed allocation (and on CUDA their snapshot)"
    figure = f"{len(recorded)} of {len(ooms)} ranks"
    return report([Check(what, figure, ">= 1 where any ran out", not ooms or bool(recorded))])


if __name__ == "__main__":
    sys.exit(main())
