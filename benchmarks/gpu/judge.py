"""The GPU check's verdict on the Trainer's run of the pick (trainer_check.py's JSON) against the probe of it: 0 OOM
over every step with eval + generate, every step run, the eval generating at the probed length, and on a GPU the
probe's memory need at least the Trainer's device-used peak: each a check line naming its figure and target, then
"Trainer verdict: PASS|FAIL".

    python3 -m benchmarks.gpu.judge STORAGE STUDY TRAINER_JSON STEPS
"""

from __future__ import annotations

import json
import os
import sys

from benchmarks.gpu.verdict import Check, report
from tuner.search.selection import best_stable
from tuner.storage import Store

MiB = 2**20


def main() -> int:
    storage, study, path, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    if not os.path.exists(path):
        said = "none (killed at its box, or its traceback is in gpu_check.log)"
        return report([Check("the Trainer's result", said, "one", False)])
    with open(path) as fh:
        info = json.load(fh)
    if "error" in info:
        return report([Check("the Trainer's result", str(info["error"]), "a run of the pick", False)])
    best = best_stable(Store(storage).probes(study))
    needs = [r.memory_need for r in best.rows if r.memory_need is not None] if best is not None else []
    need = max(needs) if needs else None
    used = int(info.get("device_used_peak") or 0)
    knobs = info["knobs"]
    print(
        f"Trainer: {info['steps']} steps of micro {knobs['micro_batch_size']} ZeRO-{knobs['zero_stage']} (deepspeed "
        f"{info['deepspeed']}) + eval + generate at {info.get('generation_max_length')} tokens: OOM count "
        f"{info['ooms']}, peak reserved {(info.get('peak_reserved') or 0) / MiB:,.0f} MiB, device-used peak "
        f"{used / MiB:,.0f} MiB; the probe's need {(need or 0) / MiB:,.0f} MiB"
    )
    generated, probed = info.get("generation_max_length"), info.get("probed_generation_length")
    checks = [
        Check("OOM over the Trainer's steps, eval and generate", f"{info['ooms']}", "0", not info["ooms"]),
        Check("Trainer steps run", f"{info['steps']}", f"{steps}", info["steps"] == steps),
        Check("tokens the eval generated", f"{generated}", f"the probe's {probed}", generated == probed),
    ]
    if info.get("cuda"):
        checks.append(
            Check(
                "the probe's memory need",
                f"{(need or 0) / MiB:,.0f} MiB",
                f">= the Trainer's device-used peak {used / MiB:,.0f} MiB",
                need is not None and need >= used,
            )
        )
    if info["ooms"]:
        print(f"Trainer OOM: {info.get('cause', '')}")
    failed = report(checks)
    print("Trainer verdict: FAIL (above)" if failed else "Trainer verdict: PASS")
    return failed


if __name__ == "__main__":
    sys.exit(main())
