"""The GPU check's verdict on the Trainer's run of the pick (trainer_check.py's JSON) against the probe of it: 0 OOM
over every step with eval + generate, every step run, the eval generating at the probed length, and on a GPU the
probe's memory need at least the Trainer's device-used peak (both printed). One line "GPU CHECK PASS|FAIL ...".

    python3 benchmarks/gpu/judge.py STORAGE STUDY TRAINER_JSON STEPS
"""

from __future__ import annotations

import json
import os
import sys

from tuner.search.selection import best_stable
from tuner.storage import Store

MiB = 2**20


def main() -> int:
    storage, study, path, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    if not os.path.exists(path):
        print("GPU CHECK FAIL: the Trainer run ended without a result (its traceback is in gpu_check.log)")
        return 1
    with open(path) as fh:
        info = json.load(fh)
    if "error" in info:
        print("GPU CHECK FAIL:", info["error"])
        return 1
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
    problems = []
    if info["ooms"]:
        problems.append(f"{info['ooms']} OOM: {info.get('cause', '')}")
    if info["steps"] != steps:
        problems.append(f"{info['steps']} of {steps} steps")
    if info.get("generation_max_length") != info.get("probed_generation_length"):
        problems.append(
            f"the eval generated {info.get('generation_max_length')} tokens, the probe "
            f"{info.get('probed_generation_length')}"
        )
    if info.get("cuda") and (need is None or need < used):
        problems.append(f"the probe's need {(need or 0) / MiB:,.0f} MiB < the Trainer's device-used peak")
    print(("GPU CHECK FAIL: " + "; ".join(problems)) if problems else "GPU CHECK PASS")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
