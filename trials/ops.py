"""``python -m trials.ops [--verbose] KEY [KEY ...]``: builds DeepSpeed's JIT ops into TORCH_EXTENSIONS_DIR ahead
of probes, one JSON line per op on stdout: ``{"op": KEY, "outcome": "built" | "not-needed" | "failed", "reason",
"seconds"}`` (``--verbose``: each compile command and the compiler's whole output before it).

A first-use compile takes 25-40 s on an idle machine and minutes on a busy one; inside a probe it would eat the probe's
timeout (and a probe killed mid-build leaves torch's build lock behind). The runner builds what a config needs once,
here, outside any probe's clock (tuner.probing.ops), and refuses a config whose op could not be built with this
line's reason; later loads hit the cache.
"""

from __future__ import annotations

import json
import re
import sys
import time

# op key -> DeepSpeed's builder class (the library each builds: trials.contract.OP_LIBRARIES)
OPS: dict[str, str] = {
    "cpu_adam": "CPUAdamBuilder",
    "shm_comm": "ShareMemCommBuilder",
    "fused_adam": "FusedAdamBuilder",
    "quantizer": "QuantizerBuilder",  # ZeRO++ quantized weights / gradients (CUDA only)
}
REASON_CHARS = 300
_ERROR_LINE = re.compile(r"\berror\b", re.IGNORECASE)
_NOT_THE_REASON = ("/", "[", "FAILED:", "ninja:")  # command lines (their -D flags), ninja's own words


def compiler_reason(text: str) -> str:
    """One line of why a build failed (pure): the first line of the compiler's output that says "error" (not a
    command line, not torch's "Error building extension" header), else the first line; at most REASON_CHARS."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    said = [
        line
        for line in lines
        if _ERROR_LINE.search(line) and not line.startswith(_NOT_THE_REASON) and "Error building extension" not in line
    ]
    pick = said[0] if said else (lines[0] if lines else "no output")
    return pick if len(pick) <= REASON_CHARS else pick[: REASON_CHARS - 3] + "..."


def build(key: str, verbose: bool = False) -> dict[str, str | float]:
    """Builds one op (or finds it cached); never raises: a failure is the outcome "failed" with the reason.
    ``verbose``: torch's JIT prints each compile and link command and the compiler's whole output."""
    start = time.monotonic()
    try:
        from deepspeed.accelerator import get_accelerator

        builder = get_accelerator().create_op_builder(OPS[key])
        if builder is None:
            outcome, reason = "not-needed", f"not used by the {get_accelerator().device_name()} accelerator"
        elif not builder.is_compatible():
            outcome, reason = "failed", "DeepSpeed says it is not compatible with this machine"
        else:
            builder.load(verbose=verbose)
            outcome, reason = "built", ""
    except Exception as exc:  # the compiler's, the arch list's, the builder's: each is this op's reason
        outcome, reason = "failed", compiler_reason(f"{type(exc).__name__}: {exc}")
    return {"op": key, "outcome": outcome, "reason": reason, "seconds": round(time.monotonic() - start, 2)}


def main(argv: list[str]) -> int:
    verbose = "--verbose" in argv
    keys = [k for k in argv if k != "--verbose"]
    unknown = [k for k in keys if k not in OPS]
    if unknown:
        print(f"unknown op(s) {', '.join(unknown)}; known: {', '.join(OPS)} (and --verbose)", file=sys.stderr)
        return 2
    for key in keys:
        print(json.dumps(build(key, verbose)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
