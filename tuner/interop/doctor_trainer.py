"""`tuner doctor`'s check of the pair the user trains with: their transformers (whose Trainer fills the DeepSpeed
"auto" values, tuner.interop.trainer_fill) and the DeepSpeed that runs it (this host's: the one the probes run). The
filled scheduler is judged by DeepSpeed itself (the CLI passes tuner.probing.schedule_check's verdict in). Pure."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tuner.interop.baseline import Baseline
from tuner.interop.doctor_finding import Finding
from tuner.interop.trainer_fill import refusal_fix, trainer_fill

#: DeepSpeed's verdict on a DeepSpeed JSON's scheduler: (its reason for refusing it or None, DeepSpeed's version);
#: None when it could not be asked
ScheduleCheck = Callable[[Mapping[str, Any]], "tuple[str | None, str] | None"]


def trainer_findings(baseline: Baseline | None, check: ScheduleCheck | None) -> list[Finding]:
    """The finding naming the pair when DeepSpeed refuses the scheduler the user's Trainer fills (none otherwise)."""
    if baseline is None or check is None or not isinstance(baseline.ds_config.get("scheduler"), Mapping):
        return []
    verdict = check(baseline.ds_config)
    if verdict is None or verdict[0] is None:
        return []
    refusal, deepspeed = verdict
    fill = trainer_fill(baseline.transformers)
    fixes = baseline.trainer_fixes()
    kind = (baseline.ds_config.get("scheduler") or {}).get("type")
    return [
        Finding(
            code="trainer-scheduler-refused",
            severity="warn",
            title=f"{fill.named} with deepspeed {deepspeed}: deepspeed.initialize refuses the {kind} scheduler your "
            f"Trainer fills ({refusal})",
            why=fixes[0].why if fixes else "DeepSpeed's own check of the scheduler section, as the Trainer fills it",
            fix=refusal_fix(fill, fixes) if fixes else "change the scheduler params DeepSpeed names",
            search=f"tuner search --transformers-version {fill.version} probes your config as trial 0 (refused "
            "with this reason, before launching) and the fixed one as the exports write it",
            number="no number: the run stops at deepspeed.initialize, before its first step",
        )
    ]
