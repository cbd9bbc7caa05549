"""Whether an SFT recipe's SFTTrainer collates its batches padding-free (tuner.job.packing says how)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trials.contract_job import PaddingFree
from tuner.job.ledger import falsy
from tuner.job.ledger.trl import packing_of, read_recipe


def padding_free_of(hf_args: Mapping[str, Any] | None) -> PaddingFree | None:
    """How an SFT recipe's SFTTrainer collates its batches padding-free (None: padded rows): BFD packing's rows of
    several samples ("bfd"), or ``padding_free`` over wrapped rows or, without packing (max_length: null, else
    refused before this: tuner.job.ledger.trl), over the samples, a sequence each ("rows")."""
    if not hf_args:
        return None
    try:
        if read_recipe(hf_args).kind != "sft":
            return None
    except ValueError:
        return None
    packing = packing_of(hf_args)
    if packing in ("bfd", "bfd_split"):
        return "bfd"
    return None if falsy(hf_args.get("padding_free")) else "rows"
