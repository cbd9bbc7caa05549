"""Every read endpoint of the API under load, side by side with GET /health in one run: starts a real `tuner serve`
(uvicorn) on a populated storage and hits each endpoint in turn with N concurrent clients (httpx, asyncio, one
connection each) on loopback; prints throughput, p50/p99 and the throughput as a fraction of /health's, per storage
backend. Each endpoint's first read (which fills the server's per-study caches: api.cache) is timed on its own
(first_ms), before its load.

    .venv/bin/python benchmarks/api_latency.py                          # SQLite and PostgreSQL, 100 clients
    .venv/bin/python benchmarks/api_latency.py --probes 10000 --requests 1500   # the issue-13 10,000-trial study
    .venv/bin/python benchmarks/api_latency.py --backend sqlite --endpoints best-config

The storage is populated through the same writers `tuner search` uses (Store.record_probe, Optuna trials) with
--probes probe rows and as many trials in one study. PostgreSQL: a throwaway database on --pg-admin, dropped
afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from trials.contract import free_port

ROOT = Path(__file__).resolve().parents[1]
TUNER = str(Path(sys.executable).parent / "tuner")
STUDY = "bench"
MiB = 1 << 20


def populate(url: str, n_probes: int, seed: int = 0) -> None:
    """One study of ``n_probes`` probe rows (ok, oom, unstable, inferred) and as many Optuna trials."""
    import optuna
    from optuna.distributions import CategoricalDistribution, IntDistribution
    from optuna.trial import TrialState

    from trials.contract import Knobs, ProbeConfig
    from tuner.records import ProbeRow
    from tuner.storage import Store, optuna_storage

    rng = random.Random(seed)
    store = Store(url)
    store.ensure_study(STUDY, {"model": "builtin:tiny-t5", "world_size": 4, "global_batch": 64, "headroom": 0.9})
    run = store.start_run(STUDY, "bench:1", 7200.0, None)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=STUDY, storage=optuna_storage(url, None, None), direction="maximize")
    dist = {"micro_batch_size": IntDistribution(1, 16), "zero_stage": CategoricalDistribution([0, 1, 2, 3])}
    capacity = 80 * 1024 * MiB
    for number in range(n_probes):
        micro, zero = rng.choice([1, 2, 4, 8, 16]), rng.randint(0, 3)
        knobs = Knobs(
            micro_batch_size=micro, max_length=512, zero_stage=zero, gradient_checkpointing=rng.random() < 0.5
        )
        accum = max(1, 64 // (micro * 4))
        peak = int(capacity * rng.uniform(0.3, 1.2))
        status = "oom" if peak > capacity else "ok"
        samples = rng.uniform(5, 50) if status == "ok" else None
        key = hashlib.sha256(json.dumps([knobs.model_dump(), number]).encode()).hexdigest()[:32]
        store.record_probe(
            ProbeRow.from_record(
                {
                    "study_name": STUDY,
                    "trial_number": number,
                    "run_id": run,
                    "fidelity": "short",
                    "config_key": key,
                    "knobs": knobs.model_dump(),
                    "status": status,
                    "config": ProbeConfig(knobs=knobs, world_size=4, gradient_accumulation_steps=accum).model_dump(
                        mode="json"
                    ),
                    "cause": "torch.OutOfMemoryError: CUDA out of memory" if status == "oom" else None,
                    "samples_per_s": samples,
                    "tokens_per_s": samples * 512 if samples else None,
                    "objective": samples * 512 if samples else None,
                    "peak_allocated": min(peak, capacity),
                    "peak_reserved": min(peak, capacity),
                    "capacity": capacity,
                    "alloc_retries": 0,
                    "stable": status == "ok" and peak <= 0.9 * capacity,
                    "probe_seconds": 40.0,
                    "setup_s": 12.0,
                    "result": {
                        "status": status,
                        "ranks": [{"rank": r, "peak_allocated": min(peak, capacity)} for r in range(4)],
                        "versions": {"torch": "2.13.0"},
                        "fingerprint": {"gpu": "A100-SXM4-80GB", "count": 4},
                    },
                }
            )
        )
        state = TrialState.COMPLETE if status == "ok" else TrialState.PRUNED
        study.add_trial(
            optuna.trial.create_trial(
                state=state,
                value=samples * 512 if samples else None,
                params={"micro_batch_size": micro, "zero_stage": zero},
                distributions=dist,
            )
        )
    store.finish_run(run, "finished")


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process (Linux /proc), to split the load between server and clients."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(url: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNER_")}
    proc = subprocess.Popen(
        [TUNER, "serve", "--storage", url, "--port", str(port), "--log-level", "warning"],
        env=env,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"tuner serve exited with {proc.returncode}")
        try:
            httpx.get(base + "/health", timeout=2).raise_for_status()
            return proc, base
        except httpx.HTTPError:
            time.sleep(0.1)
    raise SystemExit("tuner serve did not come up in 60 s")


def endpoints(n_trials: int, fmt: str) -> dict[str, str]:
    """name -> path of every read endpoint (trial pages at the start, the end and filtered by state)."""
    last = max(0, n_trials - 50)
    return {
        "health": "/health",
        "studies": "/studies",
        "study": f"/studies/{STUDY}",
        "trials-first": f"/studies/{STUDY}/trials?limit=50",
        "trials-last": f"/studies/{STUDY}/trials?limit=50&offset={last}",
        "trials-pruned": f"/studies/{STUDY}/trials?limit=50&state=PRUNED",
        "best-config": f"/best-config?study={STUDY}&format={fmt}",
        "best-config-raw": f"/best-config?study={STUDY}&format=deepspeed&raw=true",
    }


async def load(base: str, path: str, clients: int, total: int) -> tuple[list[float], float, int]:
    """``clients`` concurrent clients, each with its own connection, until ``total`` requests of ``path`` are done."""
    latencies: list[float] = []
    errors = 0
    remaining = total

    async def client() -> None:
        nonlocal remaining, errors
        async with httpx.AsyncClient(base_url=base, timeout=120) as http:
            await http.get(path)  # connect + warm this connection
            while remaining > 0:
                remaining -= 1
                t0 = time.perf_counter()
                try:
                    r = await http.get(path)
                    errors += r.status_code != 200
                except httpx.HTTPError:
                    errors += 1
                latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return latencies, time.perf_counter() - t0, errors


def bench(url: str, backend: str, args: argparse.Namespace) -> list[dict[str, object]]:
    t0 = time.perf_counter()
    populate(url, args.probes)
    fill_s = time.perf_counter() - t0
    print(f"{backend}: populated {args.probes} trials in {fill_s:.0f} s", file=sys.stderr)
    paths = endpoints(args.probes, args.format)
    wanted = ["health", *(n for n in (args.endpoints or paths) if n != "health")]
    proc, base = start_server(url)
    rows: list[dict[str, object]] = []
    try:
        for name in wanted:
            # the first read of an endpoint builds what the server caches for the study (its probe rows ranked, a
            # page): timed on its own, before the load, whose rows are the reads of an unchanged study
            t_first = time.perf_counter()
            first = httpx.get(base + paths[name], timeout=120)
            first_ms = (time.perf_counter() - t_first) * 1e3
            cpu0, client0 = cpu_seconds(proc.pid), time.process_time()
            lat, wall, errors = asyncio.run(load(base, paths[name], args.clients, args.requests))
            cpu1, client1 = cpu_seconds(proc.pid), time.process_time()
            q = statistics.quantiles(lat, n=100)
            rows.append(
                {
                    "backend": backend,
                    "endpoint": name,
                    "trials": args.probes,
                    "clients": args.clients,
                    "requests": len(lat),
                    "errors": errors + (first.status_code != 200),
                    "first_ms": first_ms,
                    "p50_ms": q[49] * 1e3,
                    "p99_ms": q[98] * 1e3,
                    "max_ms": max(lat) * 1e3,
                    "req_per_s": len(lat) / wall,
                    "vs_health": 0.0,
                    "srv_cpu_ms": (cpu1 - cpu0) * 1e3 / len(lat) if cpu0 is not None and cpu1 is not None else 0.0,
                    "cli_cpu_ms": (client1 - client0) * 1e3 / len(lat),
                }
            )
            print(f"{backend} {name}: {rows[-1]['req_per_s']:.0f} req/s", file=sys.stderr)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    health = float(rows[0]["req_per_s"])  # type: ignore[arg-type]
    for row in rows:
        row["vs_health"] = float(row["req_per_s"]) / health  # type: ignore[arg-type]
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--requests", type=int, default=3000, help="total requests, after one warm-up each")
    p.add_argument("--probes", type=int, default=200, help="probe rows (and Optuna trials) in the benchmarked study")
    p.add_argument("--endpoints", nargs="*", help="names of the endpoints to load (default: all), /health always")
    p.add_argument("--format", default="json", choices=["json", "deepspeed", "hf", "accelerate", "env"])
    p.add_argument("--pg-admin", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--json", type=Path, help="also write the rows here")
    args = p.parse_args()
    sys.path.insert(0, str(ROOT))
    rows = []
    if args.backend in ("sqlite", "both"):
        with tempfile.TemporaryDirectory() as tmp:
            rows += bench(f"sqlite:///{tmp}/bench.db", "sqlite", args)
    if args.backend in ("postgres", "both"):
        import psycopg

        name = f"tuner_bench_{secrets.token_hex(4)}"
        with psycopg.connect(args.pg_admin, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        try:
            host = args.pg_admin.split("://", 1)[1].rsplit("/", 1)[0]
            rows += bench(f"postgresql+psycopg://{host}/{name}", "postgres", args)
        finally:
            with psycopg.connect(args.pg_admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    cols = [
        "backend",
        "endpoint",
        "trials",
        "clients",
        "requests",
        "errors",
        "first_ms",
        "p50_ms",
        "p99_ms",
        "max_ms",
        "req_per_s",
        "vs_health",
        "srv_cpu_ms",
        "cli_cpu_ms",
    ]
    load1 = os.getloadavg()[0]
    print(f"{os.cpu_count()} CPUs, loopback, load average {load1:.1f}; vs_health: req/s over /health's in the same run")
    print("(srv_cpu_ms / cli_cpu_ms: CPU milliseconds per request spent by the server / by the clients; first_ms: the")
    print(" endpoint's first read, alone, before its load: it fills the server's caches for the study)")
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for row in rows:
        cells = [
            f"{row[c]:.2f}" if c == "vs_health" else f"{row[c]:.1f}" if isinstance(row[c], float) else str(row[c])
            for c in cols
        ]
        print("| " + " | ".join(cells) + " |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
