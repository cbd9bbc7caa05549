"""TRL's packing as tuner.job.packing reads it: wrapped, per map batch of samples the tokens cut into rows of
max_length, the last row the rest (TRL 1.16 data_utils._pack_wrapped under datasets' map(batched=True)); BFD, the rows
TRL's own pack_dataset makes, trained padding-free."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from tuner.job.data_job import DataJob
from tuner.job.lengths import SampleLengths
from tuner.job.packed_data import packed_data
from tuner.job.packing import bfd_lengths, wrapped_lengths
from tuner.job.padding_free import padding_free_of


def test_wrapped_rows_are_max_length_but_each_map_batchs_rest() -> None:
    rows = wrapped_lengths(SampleLengths.of([30, 50, 70, 10, 100]), 64, map_batch=3)
    # batch one: 150 tokens -> 64, 64, 22; batch two: 110 tokens -> 64, 46
    assert rows.input.tolist() == [64, 64, 22, 64, 46] and rows.target is None


def test_only_a_wrapped_sft_recipe_packs_its_data() -> None:
    data = DataJob(SampleLengths.of([10] * 20), "20 samples", eval_lengths=SampleLengths.of([10] * 7))
    wrapped = {"max_length": 64, "packing": True, "packing_strategy": "wrapped"}
    packed = packed_data(data, wrapped, 64)
    assert packed.lengths.input.tolist() == [64, 64, 64, 8] and "packed (your recipe's packing, wrapped)" in (
        packed.described
    )
    assert packed.eval_lengths is not None and packed.eval_lengths.input.tolist() == [64, 6]  # eval_packing None
    no_eval = packed_data(data, {**wrapped, "eval_packing": False}, 64)
    assert no_eval.eval_lengths is not None and len(no_eval.eval_lengths) == 7
    assert packed_data(data, {"max_length": 64, "packing": False}, 64) is data
    assert packed_data(data, {"max_length": 64, "learning_rate": 1e-4}, 64) is data  # not a recipe


def _trl_rows(samples: list[int], max_length: int, strategy: str) -> list[int]:
    """The row lengths TRL 1.16's own pack_dataset makes (the release beside the venv, as the ledger tests install)."""
    from tests.tuner.job.test_ledger_trl import trl_folder

    code = (
        "import json, sys\nfrom datasets import Dataset\nfrom trl.data_utils import pack_dataset\n"
        "n, L, s = json.loads(sys.argv[1])\n"
        "ds = Dataset.from_dict({'input_ids': [[1] * k for k in n]})\n"
        "print(json.dumps([len(r) for r in pack_dataset(ds, L, s)['input_ids']]))\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{trl_folder()}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    argv = [sys.executable, "-c", code, json.dumps([samples, max_length, strategy])]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, check=True)
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def test_bfd_rows_are_trls_own() -> None:
    samples = [int(n) for n in np.random.default_rng(7).integers(0, 300, 2300)]  # three map batches, empty ones too
    for strategy in ("bfd", "bfd_split"):
        ours = bfd_lengths(SampleLengths.of(samples), 128, split=strategy == "bfd_split").input.tolist()
        assert sorted(ours) == sorted(_trl_rows(samples, 128, strategy)), strategy


def test_a_bfd_recipe_packs_its_data_and_trains_padding_free() -> None:
    data = DataJob(SampleLengths.of([30, 50, 70, 10, 100, 5, 64, 1]), "8 samples")
    packed = packed_data(data, {"max_length": 64, "packing": True}, 64)  # bfd: TRL 1.16's default strategy
    assert packed.lengths.input.tolist() == [64, 64, 64, 61, 35] and "packing, bfd)" in packed.described
    assert padding_free_of({"max_length": 64, "packing": True}) == "bfd"
    assert padding_free_of({"packing": True, "packing_strategy": "bfd_split"}) == "bfd"
    assert padding_free_of({"packing": True, "packing_strategy": "wrapped", "padding_free": True}) == "rows"
    assert padding_free_of({"packing": True, "packing_strategy": "wrapped"}) is None
    assert padding_free_of({"padding_free": True, "max_length": None}) == "rows"  # a sample a sequence
    assert padding_free_of({"max_length": 64, "learning_rate": 1e-4}) is None
