#!/usr/bin/env bash
# GPU check (issue 41): done within 8.5 minutes on one H100/H200 whatever fails, its evidence under $OUT as it goes.
# On a bare machine: python3 with torch, transformers, accelerate, peft, typer, rich, pyyaml, httpx, psutil and no
# network; what else the tuner needs comes from the wheel kit (.whl/, built here by benchmarks/gpu/kit.sh), installed
# into a temporary site folder, never a venv. The host's TORCH_CUDA_ARCH_LIST is left as it is ("9.0a" on an H200
# image): tuner gives DeepSpeed a list it parses in its own subprocesses.
#
# The driver is benchmarks/gpu/check.py (standard library only until the kit is in): it prints its plan (each step's
# time box; the GPU image's add up to at most 8.5 minutes) and runs, each step under its own box inside a hard
# deadline computed from what is left (a step with too little left is skipped and says so), on a flan-t5-large-shaped
# T5 (random init, no download), one rank, the team's job (tests/data/seed: their ds_config.json and
# training_args.json as the baseline: ZeRO-2, CPU optimizer offload with pinned memory, their AdamW and WarmupLR, 2e8
# buckets, overlap_comm; bf16, 512 -> 128, eval batch 50 + generate):
#  kit      the wheels into a site folder;
#  env      env.txt: GPU, driver, compilers, arch lists, allocator settings, library versions;
#  ops      DeepSpeed's ops built in parallel, verbose, each under the box (ops.log);
#  pinned   the baseline's setup under each pinned-memory variant (TUNER_PINNED_ALLOC: deepspeed, register:N, exact);
#           the fastest is kept for the search and the crash study;
#  search   a 120 s search (micro 2/4/8 x offload x overlap x checkpointing under 16 GiB: real CUDA OOMs); the
#           database and the first OOM's CUDA snapshot go to $OUT as soon as it ends, killed or not;
#  crash    their config at their worst batch (2 x 6,352 tokens -> 128) under their A100's 79.15 GiB: an OOM refusing
#           4.81 GiB, its snapshot to $OUT;
#  trainer  Seq2SeqTrainer on the pick's hf export (GPU_CHECK_STEPS steps + evaluate + predict with generate);
#  tables   per probe its line, the OOM records, the crash and Trainer verdicts: every check names its figure and
#           target (probes.txt).
# Beside them, at nice 19: `tuner explain --oom-message` (from the start), `tuner explain --trial <the first OOM>` and
# the probe table's estimate column (after the search): CPU traces of flan-t5-large, minutes each, never waited for
# past the deadline; what did not end is stopped and its CPU-host command is in verdicts.txt.
#
#   benchmarks/gpu_check.sh                 # on the GPU machine, after benchmarks/gpu/kit.sh here
#   GPU_CHECK_DEADLINE=6m benchmarks/gpu_check.sh      # less time left: later steps get what is left
#   GPU_CHECK_BUDGET=120s GPU_CHECK_STEPS=10 GPU_CHECK_MAX_FIXED_S=5 GPU_CHECK_MIN_PROBES=4 benchmarks/gpu_check.sh
#                                           # the defaults (the budget sets the search's box: budget + 30 s)
#   DRY_RUN=1 KIT_SITE=.venv/lib/python3.11/site-packages PYTHON=.venv/bin/python benchmarks/gpu_check.sh
#                                           # the same driver on a CPU host: a tiny T5 on the emulated device
#   DRY_RUN=1 GPU_CHECK_FORCE=ops-fail,search-timeout,trainer-kill ... benchmarks/gpu_check.sh
#                                           # a failed op build, a search killed at its box, a Trainer killed
#   SEARCH_DRY_RUN=1 ... benchmarks/gpu_check.sh   # only the check's `tuner search ... --dry-run`
#
# stdout: the plan, one line per step (PASS / FAIL / TIMEOUT / SKIPPED, its time and box, why), the probe lines and
# checks, the traces' findings, and last "GPU CHECK PASS" or "GPU CHECK FAIL: <steps>"; exit 1 on any failure, 2 on a
# setting it cannot use. With $OUT set, at most 8 files there (none over 15 MiB): verdicts.txt, probes.txt, env.txt,
# ops.log, gpu-check.db (both studies), oom-snapshot.pickle.gz and crash-snapshot.pickle.gz (on CUDA), gpu_check.log
# (every command's output). GPU_CHECK_WORK: the work folder (default a new one under /tmp).
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" -m benchmarks.gpu.check
