"""``python -m trials.ops cpu_adam shm_comm fused_adam``: builds DeepSpeed's JIT ops into TORCH_EXTENSIONS_DIR ahead
of probes.

A first-use compile takes 25-40 s on an idle machine and minutes on a busy one; inside a probe it would eat the probe's
timeout (and a probe killed mid-build leaves torch's build lock behind). The runner builds what a config needs once,
here, outside any probe's clock; later loads hit the cache.
"""

from __future__ import annotations

import sys

# op key -> DeepSpeed's builder class (the library each builds: trials.contract.OP_LIBRARIES)
OPS: dict[str, str] = {
    "cpu_adam": "CPUAdamBuilder",
    "shm_comm": "ShareMemCommBuilder",
    "fused_adam": "FusedAdamBuilder",
}


def build(key: str) -> str:
    from deepspeed.accelerator import get_accelerator

    builder_name = OPS[key]
    builder = get_accelerator().create_op_builder(builder_name)
    if builder is None:
        return f"{key}: not used by the {get_accelerator().device_name()} accelerator"
    if not builder.is_compatible():
        return f"{key}: not compatible with this machine"
    builder.load(verbose=False)
    return f"{key}: ready"


def main(argv: list[str]) -> int:
    unknown = [k for k in argv if k not in OPS]
    if unknown:
        print(f"unknown op(s) {', '.join(unknown)}; known: {', '.join(OPS)}", file=sys.stderr)
        return 2
    for key in argv:
        print(build(key), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
