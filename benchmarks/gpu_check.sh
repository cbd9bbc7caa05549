#!/usr/bin/env bash
# GPU check (<= 6 minutes on one H200), on a bare machine: python3 with torch, transformers, accelerate, peft, typer,
# rich, pyyaml, httpx, psutil and no network. What else the tuner needs comes from the wheel kit (.whl/, built here by
# benchmarks/gpu/kit.sh), installed into a temporary site folder; never a venv.
#
# It searches a flan-t5-large-shaped T5 (random init, no download; bf16; input 512, labels 128; eval + generate)
# under --device-memory 40GiB, so large configs really OOM, over ZeRO 0-2 x micro batch x checkpointing; then runs
# the chosen config 200 worst-case steps plus one eval + generate through Seq2SeqTrainer with the study's export
# (DeepSpeed section inline), held to the same 40 GiB.
#
#   benchmarks/gpu_check.sh                 # on the GPU machine, after benchmarks/gpu/kit.sh here
#   DRY_RUN=1 KIT_SITE=.venv/lib/python3.11/site-packages PYTHON=.venv/bin/python benchmarks/gpu_check.sh
#                                           # the same script on a CPU host: a tiny T5 on the emulated device
#
# Prints each probe's fixed cost, peak reserved vs the budget, the device-used peak, the OOM count of the final run
# (must be 0) and one line "GPU CHECK PASS|FAIL ..." (exit 0 on PASS).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PY=${PYTHON:-python3}
if [ -n "${DRY_RUN:-}" ]; then
  MODEL=builtin:tiny-t5 PRECISION=fp32 MAX_LENGTH=32 TARGET_LENGTH=16 DEVICE_MEMORY=160MiB BUDGET=${GPU_CHECK_BUDGET:-20s}
  STEPS=${GPU_CHECK_STEPS:-4} MICRO="[1, 2, 4]" EVAL_BATCH=2 GLOBAL_BATCH=4 BUCKET=2000000
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
else
  MODEL=builtin:flan-t5-large PRECISION=bf16 MAX_LENGTH=512 TARGET_LENGTH=128 DEVICE_MEMORY=40GiB
  BUDGET=${GPU_CHECK_BUDGET:-4m} STEPS=${GPU_CHECK_STEPS:-200} MICRO="[4, 8, 16, 32, 64]" EVAL_BATCH=16
  GLOBAL_BATCH=64 BUCKET=50000000
fi
WORK=${GPU_CHECK_WORK:-$(mktemp -d /tmp/gpu-check.XXXXXX)}
mkdir -p "$WORK"

# the kit: wheels into a temporary site folder (or, for the dry run, a given site-packages standing in for them)
SITE=${KIT_SITE:-}
if [ -z "$SITE" ]; then
  SITE="$WORK/site"
  ls "$REPO"/.whl/*.whl > /dev/null 2>&1 || { echo "GPU CHECK FAIL: no wheel kit in .whl/ (run benchmarks/gpu/kit.sh)"; exit 1; }
  "$PY" -m pip install --quiet --no-index --no-deps --disable-pip-version-check --target "$SITE" "$REPO"/.whl/*.whl
fi
export PYTHONPATH="$REPO:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$SITE/bin:$(dirname "$(command -v "$PY")"):$PATH"  # ninja for DeepSpeed's JIT ops
export TUNER_CACHE_DIR=${TUNER_CACHE_DIR:-$WORK/cache}
DB="sqlite:///$WORK/gpu-check.db"

cat > "$WORK/space.yaml" <<YAML
micro_batch_size: $MICRO
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
YAML

echo "== gpu_check: $MODEL $PRECISION, lengths $MAX_LENGTH/$TARGET_LENGTH, eval + generate, budget $BUDGET," \
  "device memory $DEVICE_MEMORY, then $STEPS worst-case Trainer steps (work dir $WORK)"
"$PY" -c "import torch; print('device:', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu (emulated device)', '| torch', torch.__version__)"
start=$(date +%s)
"$PY" -m tuner search --budget "$BUDGET" --model "$MODEL" --space "$WORK/space.yaml" --storage "$DB" --study gpu-check \
  --global-batch "$GLOBAL_BATCH" --seed 0 --device-memory "$DEVICE_MEMORY" --precision "$PRECISION" \
  --max-length "$MAX_LENGTH" --max-target-length "$TARGET_LENGTH" --eval-batch-size "$EVAL_BATCH" --generate \
  --finalists 1 --no-estimate
echo "search took $(( $(date +%s) - start )) s"

"$PY" - "$DB" <<'PYEOF'
import sys
from tuner.storage import Store
rows = [r for r in Store(sys.argv[1]).probes("gpu-check") if r.measured]
MiB = 2**20
for r in rows:
    res = r.result or {}
    used = max((k.get("device_used_peak") or 0 for k in res.get("ranks") or []), default=0)
    print(f"probe {r.trial_number}: {r.status} fixed cost {r.setup_s or 0:.1f} s, peak reserved "
          f"{(r.peak_reserved or 0) / MiB:,.0f} MiB (need {(r.memory_need or 0) / MiB:,.0f}) of {(r.capacity or 0) / MiB:,.0f} MiB, "
          f"device-used peak {used / MiB:,.0f} MiB, {r.knobs['micro_batch_size']} x ZeRO-{r.knobs['zero_stage']}"
          f"{' ckpt' if r.knobs['gradient_checkpointing'] else ''}")
costs = sorted(r.setup_s for r in rows if r.setup_s is not None)
print(f"search: {len(rows)} probes, {sum(r.status.out_of_memory for r in rows)} OOM,"
      f" median fixed cost {costs[len(costs) // 2] if costs else float('nan'):.1f} s")
PYEOF

# one rank, as `deepspeed`/torchrun would set it for the Trainer's DeepSpeed integration
port=$("$PY" -c "from trials.contract import free_port; print(free_port())")
RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
  "$PY" benchmarks/gpu/trainer_check.py "$DB" gpu-check "$STEPS" "$WORK/trainer.json" || true
"$PY" - "$WORK/trainer.json" "$STEPS" <<'PYEOF'
import json, sys
import os
if not os.path.exists(sys.argv[1]):
    print("GPU CHECK FAIL: the Trainer run ended without a result (its traceback is above)"); sys.exit(1)
info, steps = json.load(open(sys.argv[1])), int(sys.argv[2])
MiB = 2**20
if "error" in info:
    print("GPU CHECK FAIL:", info["error"]); sys.exit(1)
line = (f"{info['steps']} Trainer steps of {info['knobs']['micro_batch_size']} x ZeRO-{info['knobs']['zero_stage']} "
        f"(deepspeed {info['deepspeed']}) + eval + generate: OOM count {info['ooms']}, peak reserved "
        f"{(info['peak_reserved'] or 0) / MiB:,.0f} MiB of {(info['budget'] or 0) / MiB:,.0f} MiB, device-used peak "
        f"{info['device_used_peak'] / MiB:,.0f} MiB")
ok = info["ooms"] == 0 and info["steps"] == steps
print(("GPU CHECK PASS: " if ok else "GPU CHECK FAIL: ") + line + ("" if ok else f" {info.get('cause', '')}"))
sys.exit(0 if ok else 1)
PYEOF
