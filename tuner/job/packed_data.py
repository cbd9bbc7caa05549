"""An SFT recipe's data as its SFTTrainer trains on it: packed into rows where the recipe packs (tuner.job.packing)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tuner.job.ledger.trl import packing_of, read_recipe
from tuner.job.lengths import SampleLengths
from tuner.job.packing import bfd_lengths, wrapped_lengths

if TYPE_CHECKING:
    from tuner.job.data_job import DataJob


def packed_data(data: DataJob, hf_args: Mapping[str, Any] | None, max_length: int) -> DataJob:
    """``data`` as an SFT recipe's SFTTrainer trains on it: its train split (``packing``) and eval split
    (``eval_packing``, None: as packing) packed into rows of ``max_length`` where the recipe packs them, as its
    strategy packs them; unchanged for any other file."""
    if not hf_args:
        return data
    try:
        if read_recipe(hf_args).kind != "sft":
            return data
    except ValueError:  # refused as a whole before this
        return data
    train, evaluated = packing_of(hf_args), packing_of(hf_args, "eval_packing")
    out = data
    if train is not None:
        rows = _rows(data.lengths, max_length, train)
        origin = dataclasses.replace(data.origin, total=None) if data.origin is not None else None  # rows, not samples
        described = f"{data.described}, {_packed(len(rows), max_length, train)}"
        out = dataclasses.replace(out, lengths=rows, described=described, origin=origin)
    if evaluated is not None and data.eval_lengths is not None:
        rows = _rows(data.eval_lengths, max_length, evaluated)
        described = f"{data.eval_described or 'eval split'}, {_packed(len(rows), max_length, evaluated)}"
        out = dataclasses.replace(out, eval_lengths=rows, eval_described=described)
    return out


def _rows(lengths: SampleLengths, max_length: int, strategy: str) -> SampleLengths:
    if strategy == "wrapped":
        return wrapped_lengths(lengths, max_length)
    return bfd_lengths(lengths, max_length, split=strategy == "bfd_split")


def _packed(rows: int, max_length: int, strategy: str) -> str:
    return f"packed (your recipe's packing, {strategy}) into {rows:,} rows of at most {max_length:,} tokens"
