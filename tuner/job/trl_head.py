"""Whether a TRL recipe's probe runs TRL's fused LM head (trials.trl_head), and the one line that says which.

TRL >= 1.16's SFTTrainer and DPOTrainer compute their loss through ``add_fused_lm_head``: tiles of
min(tokens, 4096) x 32768 in place of the (batch, length, vocabulary) logits. The probe runs TRL's own head where the
TRL installed beside tuner has it (JobSettings.trl_head, with that TRL's version and the outputs the trainer asks
for); elsewhere it keeps the full logits (as TRL < 1.16 computed them), and the dry run says so: never silently.
The version is read from the installed distribution's metadata (no trl import here).
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import metadata
from typing import Any

from packaging.version import InvalidVersion, Version

from trials.contract import TrlHead
from tuner.job.ledger.trl import read_recipe

FUSED_SINCE = "1.16.0"  # the first TRL release whose trainers compute the loss through add_fused_lm_head
SFT_OUTPUTS = ("log_probs", "entropy", "is_top1")  # sft_trainer.py:1134-1137 (TRL 1.16.0)
DPO_OUTPUTS = ("log_probs", "entropy", "mean_logits", "is_top1")  # dpo_trainer.py:957-960 (+ WPO's, use_weighting)
FUSED = (
    "the loss through TRL {}'s fused LM head, as its trainer (tiles of min(tokens, 4096) x 32768, not the full "
    "logits; trials.trl_head)"
)
NOT_INSTALLED = (
    "TRL is not installed here: the probe computes the full logits (as TRL < 1.16); install your TRL beside tuner to "
    "probe its fused head"
)
OLDER = "TRL {} here has no fused LM head: the probe computes the full logits, as its trainer does"


def installed_trl() -> str | None:
    """The version of the TRL distribution importable beside tuner, None where there is none."""
    try:
        return metadata.version("trl")
    except metadata.PackageNotFoundError:
        return None


def _fused(version: str) -> bool:
    try:
        return Version(version) >= Version(FUSED_SINCE)
    except InvalidVersion:
        return False


def trl_head_of(hf_args: Mapping[str, Any] | None, version: str | None = None) -> TrlHead | None:
    """TRL's fused head as a TRL SFT / DPO recipe's trainer runs it, where the TRL installed here (``version``:
    read when None) has it; None for any other job, or where it does not."""
    try:
        kind = read_recipe(hf_args or {}).kind
    except ValueError:
        return None
    version = version or installed_trl()
    if kind is None or version is None or not _fused(version):
        return None
    if kind == "sft":
        return TrlHead(version=version, outputs=SFT_OUTPUTS)
    weighting = ("log_sum_sq_probs",) if (hf_args or {}).get("use_weighting") else ()
    return TrlHead(version=version, outputs=DPO_OUTPUTS + weighting)


def head_line(head: TrlHead | None, version: str | None = None) -> str:
    """How a TRL recipe's probe computes the loss, one line: TRL's fused head, or the full logits and why."""
    if head is not None:
        return FUSED.format(head.version)
    version = version or installed_trl()
    return NOT_INSTALLED if version is None else OLDER.format(version)
