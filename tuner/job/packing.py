"""An SFT recipe's packed data (TRL's ``packing``): the rows SFTTrainer trains on, and how it collates them.

TRL 1.16's ``pack_dataset(..., "wrapped")`` maps the tokenized dataset in batches of ``MAP_BATCH`` samples (datasets'
``map(batched=True)`` default) and cuts each batch's concatenated tokens into rows of ``max_length``; each batch's
last row holds the rest. So almost every row is max_length tokens (the worst batch is every batch) and a few are
shorter (a batch holding one is padded by the collator). The job's data then is these rows (tuner.job.packed_data):
the dry run, the estimate and the probes read their lengths as they read any data's. BFD packing (TRL's default
strategy, ``bfd_lengths``) fills each row of max_length best-fit decreasing from a map batch's samples (cut at
max_length; ``bfd_split`` splits them), and is trained padding-free (tuner.job.padding_free): each micro batch one
row of its rows' tokens (trials.data.flattened). Pure: numpy, no torch, no trl.
"""

from __future__ import annotations

import bisect

import numpy as np

from tuner.job.lengths import SampleLengths

MAP_BATCH = 1000  # datasets' Dataset.map(batched=True) batch size, which TRL's pack_dataset uses
# the ledger's lines (tuner.job.ledger.trl) of padding-free training
PADDING_FREE = (
    "padding-free batches (BFD packing, TRL's default strategy, or padding_free): every micro batch "
    "flattened into one row of micro x max_length tokens with position_ids restarting at each sequence, no "
    "attention_mask (under sdpa / eager transformers builds that row's block-diagonal mask, quadratic in micro x "
    "max_length): the probe and the estimate run that row (tuner.job.packing)"
)
UNPACKED_PADDING_FREE = (
    "padding_free without packing and with a max_length (TRL 1.16's default 1024 where unset): SFTTrainer raises, "
    "padding-free training does not truncate"
)
UNPACKED_FIX = (
    "set max_length: null (the samples untruncated: tuner's length is then your data's longest, or --max-length) or "
    "packing: true, as TRL's error says"
)


def wrapped_lengths(lengths: SampleLengths, max_length: int, map_batch: int = MAP_BATCH) -> SampleLengths:
    """The rows TRL's wrapped packing makes of samples of ``lengths`` (inputs; a causal LM's data): per map batch of
    ``map_batch`` samples, its tokens cut into rows of ``max_length``, the last row the rest."""
    rows: list[np.ndarray] = []
    for start in range(0, len(lengths.input), map_batch):
        total = int(lengths.input[start : start + map_batch].sum())
        full, rest = divmod(total, max_length)
        rows.append(np.full(full, max_length, dtype=np.int64))
        if rest:
            rows.append(np.array([rest], dtype=np.int64))
    return SampleLengths.of(np.concatenate(rows) if rows else np.empty(0, dtype=np.int64))


def bfd_lengths(
    lengths: SampleLengths, max_length: int, split: bool = False, map_batch: int = MAP_BATCH
) -> SampleLengths:
    """The rows TRL 1.16's BFD packing (``_pack_bfd``) makes of samples of ``lengths``: per map batch of ``map_batch``
    samples, each (empty ones dropped) cut at ``max_length`` (``split``, bfd_split: split into pieces of
    max_length, the last the rest), the pieces taken longest first into the fullest row they fit (best fit), a new
    row where none does."""
    rows: list[int] = []
    for start in range(0, len(lengths.input), map_batch):
        pieces: list[int] = []
        for n in (int(v) for v in lengths.input[start : start + map_batch] if v > 0):
            if split:
                pieces += [max_length] * (n // max_length) + ([n % max_length] if n % max_length else [])
            else:
                pieces.append(min(n, max_length))
        spaces: list[tuple[int, int]] = []  # (room left, row) sorted: the best fit is the first with room >= piece
        filled: list[int] = []
        for n in sorted(pieces, reverse=True):
            at = bisect.bisect_left(spaces, (n, -1))
            if at < len(spaces):
                room, row = spaces.pop(at)
            else:
                room, row = max_length, len(filled)
                filled.append(0)
            filled[row] += n
            if room - n > 0:
                bisect.insort(spaces, (room - n, row))
        rows += filled
    return SampleLengths.of(np.array(rows, dtype=np.int64))


def packing_line(packing: str | None, padding_free: bool) -> str:
    """What the dry run's "where it comes from" says of an SFT recipe's packing and padding-free batches."""
    packed = ""
    if packing == "wrapped":
        packed = f"; packing {packing}: every row max_length tokens (the worst batch is every batch)"
    elif packing is not None:
        packed = f"; packing {packing}: rows of up to max_length tokens, best fit (the worst batch: full rows)"
    if (packing is not None and packing != "wrapped") or padding_free:
        packed += (
            "; padding-free: each micro batch one row of micro x max_length tokens, position_ids restarting at "
            "each sequence (under sdpa / eager: its block-diagonal mask, quadratic in that row)"
        )
    return packed
