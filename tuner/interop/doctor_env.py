"""`tuner doctor`'s checks of the host: the GPUs the job would see, its launcher and allocator environment. Reads
files only (no torch import); the environment comes in as an argument."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from tuner.interop.doctor_finding import Finding, fixed, when

LAUNCHER_ENV = ("WORLD_SIZE", "LOCAL_RANK", "RANK")


def visible_gpus(env: Mapping[str, str], root: Path = Path("/")) -> int | None:
    """GPUs this process would see: CUDA_VISIBLE_DEVICES when set, else the NVIDIA driver's device list; None when
    nothing says (no driver). Reads files only: importing torch to count would cost seconds."""
    if "CUDA_VISIBLE_DEVICES" in env:
        ids = [x for x in env["CUDA_VISIBLE_DEVICES"].split(",") if x.strip()]
        return 0 if ids and ids[0].strip().startswith("-") else len(ids)
    gpus = root / "proc" / "driver" / "nvidia" / "gpus"
    if gpus.is_dir():
        return sum(1 for _ in gpus.iterdir())
    devices = [p for p in (root / "dev").glob("nvidia[0-9]*") if p.name[6:].isdigit()]
    return len(devices) if devices else None


def env_traps(env: Mapping[str, str], gpus: int | None) -> list[Finding]:
    """The launcher and allocator checks, or the note that they were skipped (no GPUs visible)."""
    found = when(not gpus, fixed("skipped-gpu-checks"))
    if gpus and gpus > 1 and not any(env.get(k) for k in LAUNCHER_ENV):
        found.append(
            Finding(
                code="gpus-without-launcher",
                severity="warn",
                title=f"{gpus} GPUs visible and no launcher environment (WORLD_SIZE/LOCAL_RANK unset)",
                why="started as `python train.py`, the HF Trainer wraps the model in torch.nn.DataParallel: GPU 0 "
                "holds the optimizer and gathers every output, so it fills up while total GPU use stays low",
                fix=f"launch one process per GPU: `deepspeed --num_gpus {gpus} train.py`, `torchrun --nproc_per_node "
                f"{gpus} train.py` or `accelerate launch`; run `tuner doctor` from the same job script to check",
                search=f"tuner search --world-size {gpus} probes with one process per GPU under the DeepSpeed launcher",
                number="no number: the estimate models one process per GPU, not DataParallel's gather on GPU 0",
            )
        )
    alloc = env.get("PYTORCH_CUDA_ALLOC_CONF") or env.get("PYTORCH_ALLOC_CONF") or ""
    return found + when(bool(gpus) and "expandable_segments:True" not in alloc, fixed("allocator-fragmentation"))
