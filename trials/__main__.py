"""``python -m trials --config probe.json --out result.json``: one probe rank.

Rank and world size come from RANK / LOCAL_RANK / WORLD_SIZE (set by the runner or a launcher); without them this is
rank 0 of the config's world size. Each rank writes its own RankResult (``result.json`` for one rank,
``result.rank<r>.json`` for several), or, when it cannot, its RankReason beside it (trials.last_words, installed here
before the heavy imports). Exit code: its class (trials.contract.EXIT_CODES: 0 ok, 3 oom, 4 error, 5 timeout ...).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

_START = time.time()


def _die_with_parent() -> None:
    """Linux: the kernel SIGKILLs this rank when the process that launched it dies (``kill -9`` of ``tuner search``),
    so no orphan rank keeps running (or hangs in a collective) after its search is gone."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before prctl took effect
        from trials.contract import EXIT_ERROR

        os._exit(EXIT_ERROR)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trials", description="Runs one probe rank.")
    parser.add_argument("--config", type=Path, required=True, help="ProbeConfig JSON")
    parser.add_argument("--out", type=Path, required=True, help="where this rank writes its RankResult JSON")
    args = parser.parse_args(argv)
    _die_with_parent()

    from trials.contract import LAUNCH_ENV, ProbeConfig
    from trials.last_words import LastWords

    config = ProbeConfig.model_validate_json(args.config.read_text())
    launch = os.environ.get(LAUNCH_ENV)
    with LastWords.of_rank(config, args.out) as words:
        from trials.probe import run_probe_rank

        return run_probe_rank(config, args.out, float(launch) if launch else _START)
    return words.exit_code


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: process-group / DeepSpeed finalisers can block after a peer died. The result file is
    # already written atomically.
    os._exit(code)
