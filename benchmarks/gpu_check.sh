#!/usr/bin/env bash
# GPU check (<= 6 minutes on one H200 at the defaults, op builds included), on a bare machine: python3 with torch,
# transformers, accelerate, peft, typer, rich, pyyaml, httpx, psutil and no network. What else the tuner needs comes
# from the wheel kit (.whl/, built here by benchmarks/gpu/kit.sh), installed into a temporary site folder; never a
# venv. The host's TORCH_CUDA_ARCH_LIST is left as it is ("9.0a" on an H200 image): tuner gives DeepSpeed a list it
# parses in its own subprocesses.
#
# It runs, on a flan-t5-large-shaped T5 (random init, no download), one rank, the team's job (tests/data/seed: their
# ds_config.json and training_args.json as the baseline, trial 0: ZeRO-2, CPU optimizer offload with pinned memory,
# their AdamW and WarmupLR, 2e8 buckets, overlap_comm; bf16, 512 -> 128, eval batch 50 + generate):
#  1. `tuner prepare`: each DeepSpeed op built on its own, each reported (built / cached / not needed / failed: why);
#  2. a search (GPU_CHECK_BUDGET, 150 s) whose space (micro 2-8, offload on/off, overlap, checkpointing) and cap
#     (--device-memory 16GiB) make real CUDA OOMs among >= 6 probes; per probe one line: config, status, fixed cost by
#     phase (the engine's parts), where the rest of its time went, the timed window's spread, peaks allocated /
#     reserved / device-used, and the estimate's peak per phase beside the measured one;
#  3. `tuner explain --study gpu-check --trial <an OOM>` on its CUDA memory snapshot;
#  4. the team's crash: their config at their worst batch (2 x 6,352 input tokens, 128 target) capped at an 80 GB
#     A100's 79.15 GiB: a CUDA OOM whose refused allocation is 4.81 GiB; `tuner explain --oom-message
#     @tests/data/seed/oom.txt` (their exact text) matched to the traced allocation;
#  5. Seq2SeqTrainer with the study's hf export (GPU_CHECK_STEPS worst-case steps + evaluate + predict with generate
#     at the probed generation length, held to the same cap): 0 OOM, the probe's need >= the Trainer's device-used
#     peak (both printed).
#
#   benchmarks/gpu_check.sh                 # on the GPU machine, after benchmarks/gpu/kit.sh here
#   GPU_CHECK_BUDGET=150s GPU_CHECK_STEPS=20 benchmarks/gpu_check.sh   # the defaults
#   DRY_RUN=1 KIT_SITE=.venv/lib/python3.11/site-packages PYTHON=.venv/bin/python benchmarks/gpu_check.sh
#                                           # the same script on a CPU host: a tiny T5 on the emulated device
#   SEARCH_DRY_RUN=1 ... benchmarks/gpu_check.sh   # only the check's `tuner search ... --dry-run` (the kit's CI test)
#
# stdout: the lines above, then per probe its line, and one line "GPU CHECK PASS|FAIL ..."; every step runs whatever
# an earlier one said, and the exit is 1 on any failed assertion (each says "GPU CHECK FAIL: ..."). Everything else
# (the search's own output, DeepSpeed's and tqdm's, each explain in full) goes to gpu_check.log. With $OUT set,
# gpu_check.log, the study database (gpu-check.db, both studies) and trainer.json are written there (3 files).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PY=${PYTHON:-python3}
SEED=$REPO/tests/data/seed  # the team's files, verbatim
if [ -n "${DRY_RUN:-}" ]; then
  # their 2e8-element buckets (763 MiB each) OOM on this emulated device: trial 0 is an OOM, the pick a smaller one;
  # the crash step runs their config at a longer length (its refused allocation is the bucket's, not attention's)
  MODEL=builtin:tiny-t5 MAX_LENGTH=32 TARGET_LENGTH=16 DEVICE_MEMORY=160MiB BUDGET=${GPU_CHECK_BUDGET:-45s}
  STEPS=${GPU_CHECK_STEPS:-4} MICRO="[2, 4]" BUCKET=2000000 EVAL_BATCH=4
  MAX_FIXED_S=${GPU_CHECK_MAX_FIXED_S:-60} MIN_PROBES=2  # a shared CPU: no claim on the fixed cost or the count
  CRASH_LENGTH=64 CRASH_TARGET=16 CRASH_MEMORY=160MiB CRASH_GIB=""
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
else
  # 16 GiB: micro 2 with offload needs ~9.4 GiB of the card (the first H200 run), micro 8 or no offload (fp32 master
  # weights and Adam state on the card: +12.5 GB) run out of it
  MODEL=builtin:flan-t5-large MAX_LENGTH=512 TARGET_LENGTH=128 DEVICE_MEMORY=16GiB BUDGET=${GPU_CHECK_BUDGET:-150s}
  STEPS=${GPU_CHECK_STEPS:-20} MICRO="[2, 4, 8]" BUCKET=200000000 EVAL_BATCH=50
  MAX_FIXED_S=${GPU_CHECK_MAX_FIXED_S:-5} MIN_PROBES=${GPU_CHECK_MIN_PROBES:-6}
  CRASH_LENGTH=6352 CRASH_TARGET=128 CRASH_MEMORY=79.15GiB CRASH_GIB=4.81  # their worst batch, their card, their OOM
fi
WORK=${GPU_CHECK_WORK:-$(mktemp -d /tmp/gpu-check.XXXXXX)}
DEST=${OUT:-$WORK}
mkdir -p "$WORK" "$DEST"
LOG=$DEST/gpu_check.log
: > "$LOG"
say() { echo "$*" | tee -a "$LOG"; }
fail() { say "GPU CHECK FAIL: $*"; exit 1; }
FAILED=0  # failed steps so far: each says why, the next still runs, the exit is 1 at the end

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
offload_optimizer: [true, false]
gradient_checkpointing: [false, true]
precision: [bf16]
YAML
# the crash: their config alone, at their worst batch
cat > "$WORK/crash.yaml" <<YAML
micro_batch_size: [2]
max_length: [$CRASH_LENGTH]
engine: [deepspeed]
zero_stage: [2]
allgather_bucket_size: [200000000]
reduce_bucket_size: [200000000]
overlap_comm: [true]
contiguous_gradients: [true]
offload_optimizer: [true]
gradient_checkpointing: [false]
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
  "budget $BUDGET, device memory $DEVICE_MEMORY; their crash at $CRASH_LENGTH tokens under $CRASH_MEMORY; then $STEPS" \
  "Trainer steps (log $LOG)"
"$PY" -c "import os, torch; print('device:', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu (emulated device)', '| torch', torch.__version__, '| TORCH_CUDA_ARCH_LIST', os.environ.get('TORCH_CUDA_ARCH_LIST', 'unset'))" 2>>"$LOG" | tee -a "$LOG"
start=$(date +%s)
if ! "$PY" -m tuner prepare 2>&1 | tee -a "$LOG"; then
  say "GPU CHECK FAIL: tuner prepare could not build every DeepSpeed op (above)"; FAILED=$((FAILED + 1))
fi
say "ops prepared in $(( $(date +%s) - start )) s"
start=$(date +%s)
"$PY" -m tuner "${SEARCH[@]}" >> "$LOG" 2>&1 || fail "tuner search exited $? (see $LOG)"
say "search took $(( $(date +%s) - start )) s"

# the OOM a probe of the search ran into, explained from its record (and on a GPU its CUDA memory snapshot)
oom_trial=$("$PY" -c "import sys; from tuner.storage import Store; print(next((r.trial_number for r in Store(sys.argv[1], read_only=True).probes('gpu-check') if r.measured and r.status == 'oom' and r.trial_number is not None), ''))" "$DB" 2>>"$LOG")
if [ -n "$oom_trial" ]; then
  say "== tuner explain --study gpu-check --trial $oom_trial"
  if "$PY" -m tuner explain --storage "$DB" --study gpu-check --trial "$oom_trial" > "$WORK/explain.txt" 2>&1; then
    cat "$WORK/explain.txt" >> "$LOG"
    grep -iE "refused|snapshot|failed|allocat" "$WORK/explain.txt" | head -12 | tee -a "$LOG" || true
  else
    cat "$WORK/explain.txt" >> "$LOG"; say "GPU CHECK FAIL: tuner explain of trial $oom_trial failed (see $LOG)"
    FAILED=$((FAILED + 1))
  fi
fi

# the team's crash: their config at their worst batch, capped at their card
start=$(date +%s)
CRASH=(--model "$MODEL" --baseline "$SEED/ds_config.json" --training-args "$SEED/training_args.json" --world-size 1
  --global-batch 8 --max-length "$CRASH_LENGTH" --max-target-length "$CRASH_TARGET" --generation-max-length
  "$CRASH_TARGET" --eval-batch-size "$EVAL_BATCH" --device-memory "$CRASH_MEMORY")
# their run started (it crashed hundreds of samples in): their Trainer filled WarmupLR's warmup >= 1, as transformers
# >= 5.18 does; on a host whose transformers fills 0 (5.17 on the first H200) their files as this host fills them are
# refused before launching, which the main search shows; the crash is probed as their Trainer ran it
"$PY" -m tuner search --budget 120s --space "$WORK/crash.yaml" --storage "$DB" --study crash --n-trials 1 --seed 0 \
  --finalists 0 --no-estimate --transformers-version 5.18.0 "${CRASH[@]}" >> "$LOG" 2>&1 ||
  say "crash study: tuner search exited $?"
say "crash probe took $(( $(date +%s) - start )) s"
"$PY" benchmarks/gpu/crash_check.py "$DB" crash "$CRASH_GIB" 2>>"$LOG" | tee -a "$LOG" || FAILED=$((FAILED + 1))
start=$(date +%s)
say "== tuner explain --oom-message @tests/data/seed/oom.txt (their text) at their worst batch"
if "$PY" -m tuner explain "${CRASH[@]}" --oom-message "@$SEED/oom.txt" > "$WORK/oom.txt" 2>&1; then
  cat "$WORK/oom.txt" >> "$LOG"
  grep -E "your OOM message|matched" "$WORK/oom.txt" | tee -a "$LOG" || true
  if [ -n "$CRASH_GIB" ] && ! grep -q "matched: .*$CRASH_GIB" "$WORK/oom.txt"; then
    say "GPU CHECK FAIL: their OOM's $CRASH_GIB GiB allocation is not matched to the trace"; FAILED=$((FAILED + 1))
  fi
else
  cat "$WORK/oom.txt" >> "$LOG"; say "GPU CHECK FAIL: tuner explain --oom-message failed (see $LOG)"
  FAILED=$((FAILED + 1))
fi
say "explain took $(( $(date +%s) - start )) s"

# one rank, as `deepspeed`/torchrun would set it for the Trainer's DeepSpeed integration
port=$("$PY" -c "from trials.contract import free_port; print(free_port())")
TORCH_EXTENSIONS_DIR=$("$PY" -c "from tuner.settings import load_settings; print(load_settings().torch_extensions_dir)")
export TORCH_EXTENSIONS_DIR  # the ops the probes loaded, for the Trainer's DeepSpeed too
RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
  "$PY" benchmarks/gpu/trainer_check.py "$DB" gpu-check "$STEPS" "$DEST/trainer.json" >> "$LOG" 2>&1 || true

# last, so they end the output: the probe lines, the OOM records, the verdict
"$PY" benchmarks/gpu/probe_table.py "$DB" gpu-check "$MAX_FIXED_S" "$MIN_PROBES" 2>>"$LOG" | tee -a "$LOG" || FAILED=$((FAILED + 1))
"$PY" benchmarks/gpu/oom_record.py "$DB" gpu-check 2>>"$LOG" | tee -a "$LOG" || FAILED=$((FAILED + 1))
"$PY" benchmarks/gpu/judge.py "$DB" gpu-check "$DEST/trainer.json" "$STEPS" 2>>"$LOG" | tee -a "$LOG" || FAILED=$((FAILED + 1))
if [ "$FAILED" != 0 ]; then
  say "GPU CHECK FAIL: $FAILED step(s) failed (each said above)"
  exit 1
fi
