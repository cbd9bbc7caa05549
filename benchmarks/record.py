"""Records a table of REAL probes over a full grid, for benchmarks/replay.py.

Every config of the grid (a search-space YAML/TOML, or JSON on the command line) is probed ``--repeats`` times through
``tuner.probing.runner.run_probe`` — passes over the whole grid, so the machine's load drifts across the repeats rather
than within one config. Each repeat keeps status, samples/s, peak memory, probe seconds and the whole ProbeResult. The
table is saved after every probe (``benchmarks/tables/<name>.json`` + ``.csv``); rerunning the same command resumes it.
A fake-tensor memory trace of the grid's (micro, max_length, checkpointing, precision) points, and of each FSDP2
config (trials.trace_fsdp), is stored with it so the replay can run the estimator without torch.

    nice -n 5 .venv/bin/python -m benchmarks.record --name tiny-1rank --model builtin:tiny-t5 \\
        --grid '{"micro_batch_size": [2, 4, 8, 16], "max_length": [128, 256], "zero_stage": [0, 2]}' \\
        --device-memory 96MiB --global-batch 16 --repeats 2
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.record_job import job_record, job_trainer, recorded_job
from trials.contract import JobSettings, ModelSpec, ProbeResult
from tuner.cli.estimate import _parse_size
from tuner.job.batching import accumulation_steps
from tuner.job.space import Space, config_key, load_space, space_from_dict
from tuner.memory.estimator import Evaluation, accumulates, fsdp_at, trace, trace_at
from tuner.memory.frontier import describe
from tuner.probing.config import probe_config

TABLES = Path(__file__).with_name("tables")
#: the emulated device's accounting a new table is recorded with: 2 counts no meta-device tensor and no host buffer
#: (the tables before it, version 1, did: benchmarks.replay.tracker_artifacts)
TRACKER_VERSION = 2
BASE_GRID: dict[str, Any] = {  # knobs a --grid leaves out are fixed here, not at the search's defaults
    "engine": ["deepspeed"],
    "zero_stage": [0],
    "allgather_bucket_size": [2_000_000],
    "reduce_bucket_size": [2_000_000],
    "overlap_comm": [False],
    "contiguous_gradients": [True],
    "offload_optimizer": [False],
    "gradient_checkpointing": [False],
    "precision": ["fp32"],
}


def machine() -> dict[str, Any]:
    import deepspeed
    import torch
    import transformers

    return {
        "host": platform.node(),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "deepspeed": deepspeed.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),  # unset: the runner gives each rank cores // ranks
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def build_space(args: argparse.Namespace) -> Space:
    if args.space:
        return load_space(args.space)
    grid = {**BASE_GRID, **json.loads(args.grid)}
    return space_from_dict(grid, "--grid")


def save(table: dict[str, Any], path: Path) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(table, indent=1))
    tmp.replace(path)
    with path.with_suffix(".csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        knob_names = sorted({k for row in table["rows"] for k in row["knobs"]})
        w.writerow(
            [*knob_names, "repeat", "status", "samples_per_s", "peak_allocated", "probe_seconds", "setup_s", "cause"]
        )
        for row in table["rows"]:
            for i, rep in enumerate(row["repeats"]):
                w.writerow(
                    [
                        *(row["knobs"].get(k) for k in knob_names),
                        i,
                        rep["status"],
                        rep["samples_per_s"],
                        rep["peak_allocated"],
                        rep["probe_seconds"],
                        rep["setup_s"],
                        (rep["cause"] or "")[:120],
                    ]
                )


def repeat_entry(result: ProbeResult) -> dict[str, Any]:
    return {
        "status": result.status,
        "cause": result.cause,
        "samples_per_s": result.samples_per_s,
        "peak_allocated": result.peak_allocated,
        "capacity": result.capacity,
        "alloc_retries": result.alloc_retries,
        "probe_seconds": result.wall_s,
        "setup_s": result.setup_s,
        "result": result.model_dump(mode="json"),
    }


def evaluation_of(space: Space, job: JobSettings) -> Evaluation | None:
    """What the grid's eval knobs trace (the eval forward at the grid's largest eval batch, generate to the job's
    generation length), as `tuner search` traces its job's evaluation; None: the grid does not evaluate."""
    sizes = [n for n in space.eval_batch_size if n is not None]
    if not sizes and True not in space.generate:
        return None
    return Evaluation(
        eval_batch_size=max(sizes or space.micro_batch_size),
        generate=True in space.generate,
        generation_max_length=job.generation_max_length or job.max_target_length,
        num_beams=job.num_beams,
    )


def search_trace(
    model: ModelSpec, space: Space, world_size: int, global_batch: int, job: JobSettings | None = None
) -> dict[str, Any]:
    """What `tuner search` itself traces for this space (tuner.memory.tracing, with the shapes a search passes: this
    recorder's probes run the table's job: its LoRA adapters if any, its label and generation lengths, the grid's
    evaluation), and how long it takes: the replay charges these seconds to the strategies that use the estimate,
    before their first probe."""
    from tuner.memory.tracing import TraceShapes, build_estimator, trace_points

    job = job or JobSettings()
    shapes = TraceShapes(
        model=model,
        space=space,
        world_size=world_size,
        global_batch=global_batch,
        lora=job.lora,
        label_length=job.max_target_length,
        evaluation=evaluation_of(space, job),
        trainer=job_trainer(job),
    )
    t0 = time.perf_counter()
    estimator, note = build_estimator(shapes, timeout_s=1800)
    if estimator is None:
        raise SystemExit(f"the search's trace failed: {note}")
    seconds = time.perf_counter() - t0
    return {
        "points": [list(p) for p in trace_points(space)],
        "seconds": seconds,
        "trace": estimator.trace.model_dump(),
    }


def open_table(
    path: Path, args: argparse.Namespace, model: ModelSpec, space: Space, capacity: int | None, job: JobSettings
) -> dict[str, Any]:
    """The table at ``path`` to resume (recorded with the same LoRA job), or a new one."""
    lora = job.lora
    asked = lora.model_dump(mode="json") if lora is not None else None
    if path.exists():
        table: dict[str, Any] = json.loads(path.read_text())
        if (table.get("lora") or None) != asked:
            raise SystemExit(f"{path} was recorded with LoRA {table.get('lora')}; this command asks for {lora}")
        return table
    return {
        "name": args.name,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "tracker_version": TRACKER_VERSION,
        "model": model.model_dump(),
        "world_size": args.world_size,
        **({"nnodes": args.nnodes} if args.nnodes > 1 else {}),
        "global_batch": args.global_batch,
        "device_memory": capacity,
        "headroom": args.headroom,
        "warmup_steps": args.warmup,
        "measure_steps": args.measure,
        "space": space.model_dump(mode="json"),
        "lora": asked,
        "job": job_record(job),
        "trace": None,
        "rows": [],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.record", description=__doc__.splitlines()[0])
    ap.add_argument("--name", required=True, help="table name: benchmarks/tables/<name>.json")
    ap.add_argument("--model", default="builtin:tiny-t5")
    ap.add_argument("--override", action="append", default=[], help="model config field=value (int), repeatable")
    ap.add_argument("--space", help="search-space YAML/TOML file for the grid")
    ap.add_argument("--grid", default='{"micro_batch_size": [2, 4, 8], "max_length": [128]}', help="grid as JSON")
    ap.add_argument("--world-size", type=int, default=1)
    ap.add_argument(
        "--nnodes",
        type=int,
        default=1,
        help="probe across this many nodes on this host: one torchrun agent each, world-size / nnodes ranks on each "
        "(tuner.probing.local_nodes)",
    )
    ap.add_argument("--device-memory", required=True, help="emulated device memory per rank, e.g. 96MiB")
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--lora-r", type=int, help="a LoRA job: the adapters' rank (every probe and trace trains them)")
    ap.add_argument("--lora-alpha", type=int, default=None, help="lora_alpha (default: peft's, 8)")
    ap.add_argument("--lora-target-modules", default=None, help="e.g. q_proj,v_proj (default: peft's for the model)")
    ap.add_argument("--max-target-length", type=int, help="seq2seq label length (default: max_length)")
    ap.add_argument(
        "--training-args",
        type=Path,
        help="training args the job runs: a training-args JSON or a TRL recipe (YAML / JSON), read as `tuner search "
        "--baseline FILE` reads it (benchmarks.record_job: their optimizer, loss, a DPO recipe's pairs and reference, "
        "packing, use_peft, TRL's fused head where TRL >= 1.16 is importable)",
    )
    ap.add_argument(
        "--generation-max-length", type=int, help="new tokens of the eval generate (grid knob generate: [true])"
    )
    ap.add_argument("--headroom", type=float, default=0.9)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--measure", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=240.0)
    ap.add_argument("--out-dir", type=Path, default=TABLES)
    ap.add_argument("--no-trace", action="store_true", help="skip the fake-tensor memory trace")
    ap.add_argument(
        "--retrace",
        action="store_true",
        help="trace again (both traces) even if the table has them, e.g. after the trace gained a field",
    )
    args = ap.parse_args(argv)

    from tuner.probing.local_nodes import run_local_probe
    from tuner.probing.runner import run_probe  # the real runner (helper A)

    if args.nnodes < 1 or args.world_size % args.nnodes:
        raise SystemExit(f"--world-size {args.world_size} is not --nnodes {args.nnodes} nodes of equal ranks")

    overrides = {k: int(v) for k, v in (o.split("=", 1) for o in args.override)}
    model = ModelSpec(source=args.model, overrides=overrides)
    space = build_space(args)
    job = recorded_job(
        model,
        space.max_length,
        args.training_args,
        lora_r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_target_modules=args.lora_target_modules,
        max_target_length=args.max_target_length,
        generation_max_length=args.generation_max_length,
    )
    capacity = _parse_size(args.device_memory)
    configs = [k for k in space.configs() if accumulation_steps(args.global_batch, k.micro_batch_size, args.world_size)]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    path = args.out_dir / f"{args.name}.json"
    table = open_table(path, args, model, space, capacity, job)
    table.pop("command", None)
    table["space"] = space.model_dump(mode="json")
    table.setdefault("commands", []).append(
        "python -m benchmarks.record " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    )
    if args.retrace:
        table["trace"] = table["search_trace"] = None
    rows = {r["config_key"]: r for r in table["rows"]}
    for knobs in configs:
        accum = accumulation_steps(args.global_batch, knobs.micro_batch_size, args.world_size) or 1
        key = config_key(knobs, args.world_size, accum)
        if key not in rows:
            rows[key] = {"config_key": key, "knobs": knobs.model_dump(mode="json"), "accum": accum, "repeats": []}
            table["rows"].append(rows[key])
    if not args.no_trace and table.get("trace") is None:
        points = sorted({trace_at(k) for k in configs if k.engine != "fsdp2"})
        sharded = sorted(
            {
                fsdp_at(k, args.world_size, accumulates(args.global_batch, k.micro_batch_size, args.world_size))
                for k in configs
                if k.engine == "fsdp2"
            }
        )
        t0 = time.perf_counter()
        table["trace"] = trace(
            model,
            points,
            timeout_s=1800,
            lora=job.lora,
            label_length=job.max_target_length,
            evaluation=evaluation_of(space, job),
            fsdp_points=sharded,
            trainer=job_trainer(job),
        ).model_dump()
        print(f"traced {len(points) + len(sharded)} points in {time.perf_counter() - t0:.0f} s", flush=True)
        save(table, path)
    if not args.no_trace and table.get("search_trace") is None:
        table["search_trace"] = search_trace(model, space, args.world_size, args.global_batch, job)
        searched = table["search_trace"]["points"]
        print(f"search trace: {len(searched)} points in {table['search_trace']['seconds']:.0f} s", flush=True)
        save(table, path)
    total = len(configs) * args.repeats
    for rep in range(args.repeats):
        for n, knobs in enumerate(configs):
            accum = accumulation_steps(args.global_batch, knobs.micro_batch_size, args.world_size) or 1
            row = rows[config_key(knobs, args.world_size, accum)]
            if len(row["repeats"]) > rep:
                continue
            cfg = probe_config(
                model=model,
                knobs=knobs,
                world_size=args.world_size,
                nnodes=args.nnodes,
                gradient_accumulation_steps=accum,
                warmup_steps=args.warmup,
                measure_steps=args.measure,
                device_memory=capacity,
                timeout_s=args.timeout,
                job=job,
            )
            result = run_probe(cfg) if args.nnodes == 1 else run_local_probe(cfg)
            row["repeats"].append(repeat_entry(result))
            save(table, path)
            done = rep * len(configs) + n + 1
            peak = (result.peak_allocated or 0) / 2**20
            print(
                f"[{done}/{total}] {describe(knobs.model_dump())} -> {result.status} "
                f"{result.samples_per_s or 0:.2f} samples/s "
                f"peak {peak:.1f} MiB in {result.wall_s:.1f} s",
                flush=True,
            )
    print(f"saved {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
