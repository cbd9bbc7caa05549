#!/usr/bin/env bash
# GPU check (<= 5 minutes on one H200 at the defaults), on a bare machine: python3 with torch, transformers,
# accelerate, peft, typer, rich, pyyaml, httpx, psutil and no network. What else the tuner needs comes from the wheel
# kit (.whl/, built here by benchmarks/gpu/kit.sh), installed into a temporary site folder; never a venv.
#
# It checks the team's job (tests/data/seed: their ds_config.json and training_args.json as the baseline, trial 0:
# ZeRO-2, CPU optimizer offload with pinned memory, their AdamW and WarmupLR, 2e8 buckets, overlap_comm; bf16, eval
# batch 50 + generate) on a flan-t5-large-shaped T5 (random init, no download) at lengths 512 -> 128, one rank, under
# --device-memory 40GiB so large configs really OOM; then runs the pick GPU_CHECK_STEPS worst-case steps plus one eval
# + generate (at the probed generation length) through Seq2SeqTrainer with the study's hf export, held to 40 GiB.
#
#   benchmarks/gpu_check.sh                 # on the GPU machine, after benchmarks/gpu/kit.sh here
#   GPU_CHECK_BUDGET=90s GPU_CHECK_STEPS=30 benchmarks/gpu_check.sh    # the defaults
#   DRY_RUN=1 KIT_SITE=.venv/lib/python3.11/site-packages PYTHON=.venv/bin/python benchmarks/gpu_check.sh
#                                           # the same script on a CPU host: a tiny T5 on the emulated device
#   SEARCH_DRY_RUN=1 ... benchmarks/gpu_check.sh   # only the check's `tuner search ... --dry-run` (the kit's CI test)
#
# stdout: per probe its config, status, fixed cost, peaks allocated/reserved/device-used; the pick; the Trainer's
# result; one line "GPU CHECK PASS|FAIL ..." (exit 0 on PASS, 1 on any failed assertion). Everything else (the
# search's own output, DeepSpeed's and tqdm's) goes to gpu_check.log. With $OUT set, gpu_check.log, the study
# database (gpu-check.db) and trainer.json are written there.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PY=${PYTHON:-python3}
SEED=$REPO/tests/data/seed  # the team's files, verbatim
if [ -n "${DRY_RUN:-}" ]; then
  # their 2e8-element buckets (763 MiB each) OOM on this emulated device: trial 0 is an OOM, the pick a smaller one
  MODEL=builtin:tiny-t5 MAX_LENGTH=32 TARGET_LENGTH=16 DEVICE_MEMORY=160MiB BUDGET=${GPU_CHECK_BUDGET:-45s}
  STEPS=${GPU_CHECK_STEPS:-4} MICRO="[2, 4]" BUCKET=2000000 EVAL_BATCH=4
  MAX_FIXED_S=${GPU_CHECK_MAX_FIXED_S:-60}  # a shared CPU: no claim on the fixed cost
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
else
  MODEL=builtin:flan-t5-large MAX_LENGTH=512 TARGET_LENGTH=128 DEVICE_MEMORY=40GiB BUDGET=${GPU_CHECK_BUDGET:-90s}
  STEPS=${GPU_CHECK_STEPS:-30} MICRO="[2, 4, 8]" BUCKET=200000000 EVAL_BATCH=50
  MAX_FIXED_S=${GPU_CHECK_MAX_FIXED_S:-5}
fi
WORK=${GPU_CHECK_WORK:-$(mktemp -d /tmp/gpu-check.XXXXXX)}
DEST=${OUT:-$WORK}
mkdir -p "$WORK" "$DEST"
LOG=$DEST/gpu_check.log
: > "$LOG"
say() { echo "$*" | tee -a "$LOG"; }
fail() { say "GPU CHECK FAIL: $*"; exit 1; }

# the kit: wheels into a temporary site folder (or, for the dry run, a given site-packages standing in for them)
SITE=${KIT_SITE:-}
if [ -z "$SITE" ]; then
  SITE="$WORK/site"
  ls "$REPO"/.whl/*.whl > /dev/null 2>&1 || fail "no wheel kit in .whl/ (run benchmarks/gpu/kit.sh)"
  "$PY" -m pip install --quiet --no-index --no-deps --disable-pip-version-check --target "$SITE" "$REPO"/.whl/*.whl \
    >> "$LOG" 2>&1 || fail "the wheel kit did not install (see $LOG)"
fi
export PYTHONPATH="$REPO:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$SITE/bin:$(dirname "$(command -v "$PY")"):$PATH"  # ninja for DeepSpeed's JIT ops
export TUNER_CACHE_DIR=${TUNER_CACHE_DIR:-$WORK/cache}
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error DS_DISABLE_NVML_WARNING=1 TQDM_DISABLE=1
DB_FILE=$WORK/gpu-check.db
rm -rf "$DB_FILE" "$DB_FILE".journal.d
DB="sqlite:///$DB_FILE"
# the study database comes back with the log whatever happens (a plain file: $OUT returns no folders)
if [ "$DEST" != "$WORK" ]; then trap 'cp -f "$DB_FILE" "$DEST/" 2>/dev/null || true' EXIT; fi

# the space around their config: their stage, offload and buckets; micro batch, overlap_comm and checkpointing searched
cat > "$WORK/space.yaml" <<YAML
micro_batch_size: $MICRO
max_length: [$MAX_LENGTH]
engine: [deepspeed]
zero_stage: [2]
allgather_bucket_size: [$BUCKET]
reduce_bucket_size: [$BUCKET]
overlap_comm: [true, false]
contiguous_gradients: [true]
offload_optimizer: [true]
gradient_checkpointing: [false, true]
precision: [bf16]
YAML
SEARCH=(search --budget "$BUDGET" --model "$MODEL" --space "$WORK/space.yaml" --storage "$DB" --study gpu-check
  --baseline "$SEED/ds_config.json" --training-args "$SEED/training_args.json" --world-size 1 --global-batch 8
  --seed 0 --device-memory "$DEVICE_MEMORY" --max-length "$MAX_LENGTH" --max-target-length "$TARGET_LENGTH"
  --generation-max-length "$TARGET_LENGTH" --eval-batch-size "$EVAL_BATCH" --finalists 1 --no-estimate)
if [ -n "${SEARCH_DRY_RUN:-}" ]; then
  exec "$PY" -m tuner "${SEARCH[@]}" --dry-run
fi

say "== gpu_check: the team's job on $MODEL (bf16, $MAX_LENGTH -> $TARGET_LENGTH, eval batch $EVAL_BATCH + generate)," \
  "budget $BUDGET, device memory $DEVICE_MEMORY, then $STEPS Trainer steps (log $LOG)"
"$PY" -c "import torch; print('device:', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu (emulated device)', '| torch', torch.__version__)" 2>>"$LOG" | tee -a "$LOG"
start=$(date +%s)
"$PY" -m tuner prepare >> "$LOG" 2>&1 || fail "tuner prepare could not build the DeepSpeed ops (see $LOG)"
say "ops prepared in $(( $(date +%s) - start )) s"
start=$(date +%s)
"$PY" -m tuner "${SEARCH[@]}" >> "$LOG" 2>&1 || fail "tuner search exited $? (see $LOG)"
say "search took $(( $(date +%s) - start )) s"
if ! "$PY" benchmarks/gpu/probe_table.py "$DB" gpu-check "$MAX_FIXED_S" 2>>"$LOG" | tee -a "$LOG"; then
  fail "the probes failed an assertion (above)"
fi
"$PY" benchmarks/gpu/oom_record.py "$DB" gpu-check 2>>"$LOG" | tee -a "$LOG" || fail "an OOM left no record (above)"

# one rank, as `deepspeed`/torchrun would set it for the Trainer's DeepSpeed integration
port=$("$PY" -c "from trials.contract import free_port; print(free_port())")
TORCH_EXTENSIONS_DIR=$("$PY" -c "from tuner.settings import load_settings; print(load_settings().torch_extensions_dir)")
export TORCH_EXTENSIONS_DIR  # the ops the probes loaded, for the Trainer's DeepSpeed too
RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
  "$PY" benchmarks/gpu/trainer_check.py "$DB" gpu-check "$STEPS" "$DEST/trainer.json" >> "$LOG" 2>&1 || true
if ! "$PY" benchmarks/gpu/judge.py "$DB" gpu-check "$DEST/trainer.json" "$STEPS" 2>>"$LOG" | tee -a "$LOG"; then
  exit 1
fi
