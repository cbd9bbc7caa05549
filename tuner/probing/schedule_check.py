"""Before a probe launches: DeepSpeed's own verdict on the LR scheduler its DeepSpeed JSON names.

deepspeed.initialize builds the scheduler before the first step; a section it refuses (WarmupLR's warmup_num_steps 0,
as transformers <= 5.17 fills "auto" for warmup_steps 0, beside deepspeed >= 0.19.3: tuner.interop.trainer_fill)
would cost a probe's whole fixed cost to end in a bare error. ``check_schedule`` asks the installed DeepSpeed itself
(trials.ds_schedule, in a subprocess: the tuner's process imports neither torch nor DeepSpeed), once per distinct
scheduler section; ``ScheduleChecked`` wraps a probe launcher so that such a config is one REFUSED result with
DeepSpeed's reason, never launched. Trial 0 runs the user's files as their Trainer fills them, so it is the one that
meets this; the search's probes run the fixed section the exports write.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trials.contract import ProbeConfig, ProbeResult, Status
from tuner.interop.trainer_fill import WARMUP_PATH

CHECK_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class ScheduleVerdict:
    """DeepSpeed's verdict: ``refusal`` its reason ("ValueError: ..."), None when it builds the scheduler."""

    refusal: str | None
    deepspeed: str


def scheduler_key(ds: Mapping[str, Any] | None) -> str | None:
    """What DeepSpeed's verdict depends on (the scheduler section and the optimizer's lr); None without a scheduler."""
    if not ds or not isinstance(ds.get("scheduler"), Mapping):
        return None
    lr = ((ds.get("optimizer") or {}).get("params") or {}).get("lr")
    return json.dumps({"scheduler": ds["scheduler"], "lr": lr}, sort_keys=True, default=str)


def check_schedule(
    ds: Mapping[str, Any], env: Mapping[str, str] | None = None, timeout_s: float = CHECK_TIMEOUT_S
) -> ScheduleVerdict | None:
    """The installed DeepSpeed's verdict on ``ds``'s scheduler (python -m trials.ds_schedule with ``env``); None when
    it could not be asked (the probe then meets whatever it meets itself)."""
    with tempfile.TemporaryDirectory(prefix="tuner-schedule-") as tmp:
        out = Path(tmp) / "verdict.json"
        try:
            done = subprocess.run(
                [sys.executable, "-m", "trials.ds_schedule", str(out)],
                input=json.dumps(dict(ds)),
                capture_output=True,
                text=True,
                env=dict(env if env is not None else os.environ),
                timeout=timeout_s,
                check=False,
            )
            said = json.loads(out.read_text(encoding="utf-8")) if done.returncode == 0 else None
        except (OSError, ValueError, subprocess.TimeoutExpired):
            return None
    if not isinstance(said, dict):
        return None
    refusal = said.get("refusal")
    return ScheduleVerdict(refusal=str(refusal) if refusal is not None else None, deepspeed=str(said.get("deepspeed")))


def refusal_cause(verdict: ScheduleVerdict, ds: Mapping[str, Any]) -> str:
    """The one line a refused probe's row carries: DeepSpeed's reason, where, and (a warmup below 1) the fix."""
    name = (ds.get("scheduler") or {}).get("type")
    line = (
        f"refused before launching: deepspeed {verdict.deepspeed} refuses the scheduler {name} at "
        f"deepspeed.initialize: {verdict.refusal}"
    )
    node: Any = ds
    for key in WARMUP_PATH:
        node = node.get(key) if isinstance(node, Mapping) else None
    if isinstance(node, int) and not isinstance(node, bool) and node < 1:
        line += (
            "; your Trainer fills it so (transformers <= 5.17 fills warmup_steps unclamped): the search's probes and "
            "the exports run warmup 1, as transformers >= 5.18 does (`tuner best --changes`)"
        )
    return line


class ScheduleChecked:
    """A probe launcher that asks DeepSpeed about a config's scheduler before launching it (once per distinct
    section): a refused one is a REFUSED result carrying DeepSpeed's reason, launched never."""

    def __init__(
        self,
        probe: Callable[[ProbeConfig], ProbeResult],
        env: Callable[[int], Mapping[str, str]] | None = None,
    ) -> None:
        self.probe = probe
        self.env = env
        self.verdicts: dict[str, ScheduleVerdict | None] = {}

    def refusal(self, config: ProbeConfig) -> str | None:
        """The cause ``config`` is refused with, None when DeepSpeed builds its scheduler (or names none)."""
        key = scheduler_key(config.deepspeed)
        if key is None or config.deepspeed is None:
            return None
        if key not in self.verdicts:
            self.verdicts[key] = check_schedule(config.deepspeed, self.env(1) if self.env else None)
        verdict = self.verdicts[key]
        if verdict is None or verdict.refusal is None:
            return None
        return refusal_cause(verdict, config.deepspeed)

    def __call__(self, config: ProbeConfig) -> ProbeResult:
        cause = self.refusal(config)
        if cause is not None:
            return ProbeResult(status=Status.REFUSED, cause=cause)
        return self.probe(config)
