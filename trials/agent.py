"""``python -m trials.agent TORCHRUN_ARGS``: torchrun (``torch.distributed.run``, its elastic agent) as a node's tuner
worker starts it for one probe, dying with that worker (Linux: PR_SET_PDEATHSIG), as its ranks die with it
(trials.node_rank): a worker killed with ``kill -9`` leaves no agent and no rank behind on its node."""

from __future__ import annotations

import sys

from trials.__main__ import _die_with_parent


def main(argv: list[str] | None = None) -> None:
    _die_with_parent()
    from torch.distributed.run import main as torchrun

    torchrun(argv if argv is not None else sys.argv[1:])


if __name__ == "__main__":
    main()
