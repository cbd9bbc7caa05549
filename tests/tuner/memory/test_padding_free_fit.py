"""A padding-free trace (TRL's BFD packing: each micro batch one row of micro x max_length tokens) is fitted over that
flattened length: a config's bytes follow (micro x len) and (micro x len)^2, not micro x (len, len^2)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from tuner.memory.fsdp import fitted


def _points(per_row: Any) -> list[Any]:
    """Points at micro 1, 2 and 4 x 64 tokens whose bytes are per_row(micro x 64)."""
    return [SimpleNamespace(micro_batch_size=m, max_length=64, v=per_row(m * 64)) for m in (1, 2, 4)]


def test_a_padding_free_fit_reads_each_point_as_one_row_of_its_flattened_length() -> None:
    def row(n: int) -> int:
        return 100 * n + 3 * n * n  # one row of n tokens: linear + its n^2 mask

    points = cast(list[Any], _points(row))
    flat = fitted(points, lambda p: p.v, lambda p: p.micro_batch_size, 8, 64, flat=True)
    assert flat is not None and abs(flat - row(512)) <= 0.01 * row(512)  # 8 x 64: one row of 512
    linear = fitted(points, lambda p: p.v, lambda p: p.micro_batch_size, 8, 64)
    assert linear is not None and linear < 0.8 * row(512)  # read per sample, the square of the row is lost
    assert fitted(points, lambda p: p.v, lambda p: p.micro_batch_size, 2, 64, flat=True) == row(128)  # traced
