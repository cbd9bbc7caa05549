"""A config whose scheduler DeepSpeed refuses is refused before its probe launches, with DeepSpeed's own reason
(tuner.probing.schedule_check asks the installed DeepSpeed through trials.ds_schedule, on CPU; issue 30, point 2)."""

from __future__ import annotations

import importlib.metadata
from typing import Any

from trials.contract import Knobs, ModelSpec, ProbeConfig, ProbeResult, Status
from tuner.probing.schedule_check import ScheduleChecked, check_schedule

DEEPSPEED = importlib.metadata.version("deepspeed")


def warmup(steps: Any, kind: str = "WarmupLR") -> dict[str, Any]:
    params = {"warmup_min_lr": 0, "warmup_max_lr": 2e-5, "warmup_num_steps": steps}
    if kind != "WarmupLR":
        params["total_num_steps"] = 100
    return {"optimizer": {"type": "AdamW", "params": {"lr": 2e-5}}, "scheduler": {"type": kind, "params": params}}


def test_deepspeed_itself_refuses_warmup_zero_and_builds_warmup_one() -> None:
    refused = check_schedule(warmup(0))
    assert refused is not None and refused.deepspeed == DEEPSPEED
    assert refused.refusal == "ValueError: warmup_num_steps must be a positive integer, got 0"
    decay = check_schedule(warmup(0, "WarmupDecayLR"))
    assert decay is not None and decay.refusal == refused.refusal  # its subclass checks the same
    built = check_schedule(warmup(1))
    assert built is not None and built.refusal is None


def config(ds: dict[str, Any]) -> ProbeConfig:
    knobs = Knobs(micro_batch_size=1, max_length=8, zero_stage=0)
    return ProbeConfig(knobs=knobs, model=ModelSpec(source="builtin:tiny-t5"), deepspeed=ds)


def test_a_refused_config_is_one_error_result_and_never_launched() -> None:
    launched: list[ProbeConfig] = []

    def launch(c: ProbeConfig) -> ProbeResult:  # stands for the runner: records what reached it
        launched.append(c)
        return ProbeResult(status=Status.OK)

    probe = ScheduleChecked(launch)
    result = probe(config(warmup(0)))
    assert result.status == Status.REFUSED and launched == []
    assert result.cause is not None and result.cause.startswith(
        f"refused before launching: deepspeed {DEEPSPEED} refuses the scheduler WarmupLR at deepspeed.initialize: "
        "ValueError: warmup_num_steps must be a positive integer, got 0; your Trainer fills it so"
    )
    assert probe(config(warmup(1))).status == Status.OK and len(launched) == 1
    assert probe(config({**warmup(1), "steps_per_print": 5})).status == Status.OK  # same section: asked once
    assert len(probe.verdicts) == 2 and len(launched) == 2
    assert probe(config({"zero_optimization": {"stage": 0}})).status == Status.OK  # no scheduler: nothing to ask
    assert len(probe.verdicts) == 2
