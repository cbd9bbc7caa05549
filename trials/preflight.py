"""``python -m trials.preflight``: one rank of the collective check run before a search (RANK / WORLD_SIZE /
MASTER_ADDR / MASTER_PORT from the environment): init the process group (NCCL on a GPU, gloo on CPU), one
all_reduce, one barrier. Exit 0 when every rank got the world's sum; a hang is the runner's timeout."""

from __future__ import annotations

import datetime
import os
import sys


def main() -> int:
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=float(os.environ.get("TUNER_PREFLIGHT_TIMEOUT_S", "90")))
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world, timeout=timeout)
    x = torch.ones(1, device=device) * (rank + 1)
    dist.all_reduce(x)
    dist.barrier()
    expected = world * (world + 1) / 2
    if float(x.item()) != expected:
        print(f"preflight: all_reduce gave {x.item()} instead of {expected}", file=sys.stderr)
        return 1
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
