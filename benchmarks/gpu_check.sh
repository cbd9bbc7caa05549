#!/usr/bin/env bash
# GPU check (8 minutes on one H200): a real search over a flan-t5-large-shaped T5 (random init, no download) with
# ZeRO 0-2, then 200 worst-case steps (every batch padded to max_length) of the chosen config: zero OOM expected.
#
#   benchmarks/gpu_check.sh                      # on the GPU machine
#   GPU_CHECK_MODEL=builtin:tiny-t5 GPU_CHECK_STEPS=20 GPU_CHECK_BUDGET=4m GPU_CHECK_DEVICE_MEMORY=80MiB \
#     GPU_CHECK_MAX_LENGTH=128 GPU_CHECK_PRECISION=fp32 GPU_CHECK_BUCKET=2000000 OMP_NUM_THREADS=1 \
#     benchmarks/gpu_check.sh                                # the same script on a CPU machine (emulated device)
#
# Output: the search summary, the chosen config, and one line "GPU CHECK PASS|FAIL ..." (exit 0 on PASS).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
TUNER=${TUNER:-.venv/bin/tuner}
MODEL=${GPU_CHECK_MODEL:-builtin:flan-t5-large}
STEPS=${GPU_CHECK_STEPS:-200}
BUDGET=${GPU_CHECK_BUDGET:-5m}
MAX_LENGTH=${GPU_CHECK_MAX_LENGTH:-512}
GLOBAL_BATCH=${GPU_CHECK_GLOBAL_BATCH:-32}
PRECISION=${GPU_CHECK_PRECISION:-bf16}
DEVICE_MEMORY=${GPU_CHECK_DEVICE_MEMORY:-}
BUCKET=${GPU_CHECK_BUCKET:-50000000}  # elements; DeepSpeed 0.19 allocates the full reduce bucket
WORK=${GPU_CHECK_WORK:-$(mktemp -d /tmp/gpu-check.XXXXXX)}
mkdir -p "$WORK"
DB="sqlite:///$WORK/gpu-check.db"
export PATH="$(dirname "$PY"):$PATH"  # probes run with the venv's bin first (ninja: compiled-op cache stays valid)

cat > "$WORK/space.yaml" <<EOF
micro_batch_size: [2, 4, 8, 16, 32]
max_length: [$MAX_LENGTH]
engine: [deepspeed]
zero_stage: [0, 1, 2]
allgather_bucket_size: [$BUCKET]
reduce_bucket_size: [$BUCKET]
overlap_comm: [false]
contiguous_gradients: [true]
offload_optimizer: [false]
gradient_checkpointing: [false, true]
precision: [$PRECISION]
EOF

echo "== gpu_check: $MODEL, ZeRO 0-2, budget $BUDGET, then $STEPS worst-case steps (work dir $WORK)"
"$PY" -c "import torch; print('device:', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu (emulated device)')"
SEARCH_ARGS=(--budget "$BUDGET" --model "$MODEL" --space "$WORK/space.yaml" --storage "$DB" --study gpu-check
  --global-batch "$GLOBAL_BATCH" --seed 0)
if [ -n "$DEVICE_MEMORY" ]; then SEARCH_ARGS+=(--device-memory "$DEVICE_MEMORY"); fi
start=$(date +%s)
"$TUNER" search "${SEARCH_ARGS[@]}"
echo "search took $(( $(date +%s) - start )) s"
"$TUNER" best --storage "$DB" --study gpu-check -f deepspeed

"$PY" - "$DB" "$STEPS" "$WORK" <<'EOF'
"""Runs the chosen config for STEPS measured micro-steps through the real probe runner (worst-case shapes)."""
import sys
from pathlib import Path

from trials.contract import ProbeConfig
from tuner.probing.runner import run_probe
from tuner.search.selection import best_stable
from tuner.storage.store import Store

url, steps, work = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
best = best_stable(Store(url).probes("gpu-check"))
if best is None:
    print("GPU CHECK FAIL: the search found no stable config")
    sys.exit(1)
cfg = ProbeConfig.model_validate(best.config)
cfg = cfg.model_copy(update={"warmup_steps": 2, "measure_steps": steps, "timeout_s": max(cfg.timeout_s, 60.0 + steps * 3.0)})
print(f"chosen: {best.knobs} accum={cfg.gradient_accumulation_steps} objective={best.objective:.2f}"
      f" confirmed={best.confirmed}")
result = run_probe(cfg, workdir=work / "long-run")
peak = (result.peak_allocated or 0) / 2**20
cap = (result.capacity or 0) / 2**20
line = (f"{steps} worst-case steps: status={result.status} samples/s={result.samples_per_s or 0:.2f} "
        f"peak={peak:,.1f} MiB of {cap:,.1f} MiB retries={result.alloc_retries} wall={result.wall_s:.0f} s")
if result.status == "ok" and result.alloc_retries == 0:
    print("GPU CHECK PASS:", line)
    sys.exit(0)
print("GPU CHECK FAIL:", line, "cause:", result.cause)
sys.exit(1)
EOF
