"""DeepSpeed's own verdict on a config's LR scheduler section, on CPU, without a model or a process group.

deepspeed.initialize builds the scheduler a config names in ``DeepSpeedEngine._scheduler_from_config``: the type
and params read by deepspeed.runtime.config's readers, the class looked up in deepspeed.runtime.lr_schedules (else
torch.optim.lr_scheduler) and constructed on the optimizer. Its constructors check their params (WarmupLR's
"warmup_num_steps must be a positive integer, got 0" from deepspeed 0.19.3). ``scheduler_refusal`` runs that very
method on a one-parameter torch optimizer, so the verdict is the installed DeepSpeed's, in about a second and a half
(the import).

``python -m trials.ds_schedule OUT`` reads a DeepSpeed JSON on stdin and writes {"refusal": ..., "deepspeed": ...}
to the file OUT (DeepSpeed prints its own warnings to stdout: never parsed): the tuner asks it before launching a
probe (tuner.probing.schedule_check), and `tuner doctor` before it names a finding.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from trials.contract import auto_paths


def scheduler_refusal(ds: Mapping[str, Any]) -> str | None:
    """DeepSpeed's reason for refusing ``ds``'s scheduler section at deepspeed.initialize ("ValueError: ..."), or
    None when it builds (or the config names no scheduler, or leaves "auto" in it: nothing to build yet)."""
    import torch
    from deepspeed.runtime.config import get_scheduler_name, get_scheduler_params
    from deepspeed.runtime.engine import DeepSpeedEngine

    config = dict(ds)
    name = get_scheduler_name(config)
    if name is None or auto_paths(config.get("scheduler")):
        return None
    params = get_scheduler_params(config)
    view = SimpleNamespace(scheduler_name=lambda: name, scheduler_params=lambda: dict(params or {}))
    lr = ((config.get("optimizer") or {}).get("params") or {}).get("lr", 1e-3)
    lr = lr if isinstance(lr, (int, float)) and not isinstance(lr, bool) else 1e-3
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    try:
        DeepSpeedEngine._scheduler_from_config(view, optimizer)
    except (ValueError, TypeError, AssertionError, KeyError, ZeroDivisionError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def main() -> int:
    import deepspeed

    ds = json.loads(sys.stdin.read())
    said = {"refusal": scheduler_refusal(ds), "deepspeed": deepspeed.__version__}
    with open(sys.argv[1], "w", encoding="utf-8") as out:
        json.dump(said, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
