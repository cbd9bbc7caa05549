"""The GPU check's env.txt: the machine and the software the check ran on (the GPU, its driver, the compilers the op
builds use, the arch list the host sets and the one DeepSpeed gets, the allocator settings, every library's
version), one ``key: value`` line each; a tool that is missing or does not answer in a few seconds says so.

    python3 -m benchmarks.gpu.envinfo
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata

LIBRARIES = (
    "torch",
    "transformers",
    "accelerate",
    "deepspeed",
    "peft",
    "optuna",
    "sqlalchemy",
    "alembic",
    "pydantic",
    "numpy",
    "ninja",
)
TOOLS = {
    "driver": ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_cap", "--format=csv,noheader"],
    "nvcc": ["nvcc", "--version"],
    "gcc": ["gcc", "--version"],
    "c++": ["c++", "--version"],
    "ninja": ["ninja", "--version"],
}
ENV_KEYS = (
    "TORCH_CUDA_ARCH_LIST",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
    "TUNER_PINNED_ALLOC",
    "CUDA_HOME",
    "CUDA_VISIBLE_DEVICES",
    "CXX",
    "OMP_NUM_THREADS",
)


def tool(cmd: list[str]) -> str:
    """The tool's answer: its version line (nvcc: the release line), or why there is none."""
    if shutil.which(cmd[0]) is None:
        return "not found"
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"no answer ({type(exc).__name__})"
    lines = [line.strip() for line in (done.stdout or done.stderr).splitlines() if line.strip()]
    release = [line for line in lines if "release" in line]
    return (release or lines or [f"exited {done.returncode}"])[-1 if release else 0]


def versions() -> list[str]:
    out = []
    for name in LIBRARIES:
        try:
            out.append(f"{name}: {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            out.append(f"{name}: absent")
    return out


def device() -> list[str]:
    """torch's view of the device (this process initialises CUDA: it is not the fork server's)."""
    import torch

    out = [f"torch cuda: {torch.version.cuda}", f"cudnn: {torch.backends.cudnn.version()}"]
    if not torch.cuda.is_available():
        return [*out, "gpu: none (the emulated device)"]
    props = torch.cuda.get_device_properties(0)
    out += [
        f"gpu: {props.name}, {props.total_memory / 2**30:.1f} GiB, capability {props.major}.{props.minor}",
        f"gpus visible: {torch.cuda.device_count()}",
        f"torch arch list (compiled for): {' '.join(torch.cuda.get_arch_list())}",
    ]
    return out


def deepspeed_view() -> list[str]:
    """What the probes' environment gives DeepSpeed (tuner.probing.environment.probe_env)."""
    from tuner.probing.environment import probe_env
    from tuner.settings import load_settings

    env = probe_env(1)
    return [
        f"probe TORCH_CUDA_ARCH_LIST: {env.get('TORCH_CUDA_ARCH_LIST', 'unset')}",
        f"probe pinned allocation: {env.get('TUNER_PINNED_ALLOC')}",
        f"op cache: {load_settings().torch_extensions_dir}",
    ]


def main() -> int:
    lines = [
        f"python: {sys.version.split()[0]} ({sys.executable})",
        f"platform: {platform.platform()}",
        f"cpus: {os.cpu_count()}",
    ]
    try:
        with open("/proc/meminfo") as fh:
            lines.append(f"memory: {fh.readline().split(':', 1)[1].strip()}")
    except OSError:
        pass
    lines += [f"{name}: {tool(cmd)}" for name, cmd in TOOLS.items()]
    lines += [f"env {key}: {os.environ.get(key, 'unset')}" for key in ENV_KEYS]
    lines += versions()
    for part in (device, deepspeed_view):
        try:
            lines += part()
        except Exception as exc:  # one part that cannot be read is a line, the rest still printed
            lines.append(f"{part.__name__}: not read ({type(exc).__name__}: {exc})")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
