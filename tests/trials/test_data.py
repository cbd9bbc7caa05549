"""trials.data.worst_case_batch: encoder inputs at max_length, labels at the job's label length."""

from __future__ import annotations

import torch

from trials.contract import JobSettings
from trials.data import worst_case_batch


def test_seq2seq_labels_take_the_label_length_and_causal_labels_are_the_inputs() -> None:
    batch = worst_case_batch(3, 32, 100, label_length=8)
    assert batch["input_ids"].shape == (3, 32) and batch["labels"].shape == (3, 8)
    assert int(batch["labels"].min()) >= 3  # no pad/eos/unk ids: every label position counts in the loss
    same = worst_case_batch(3, 32, 100)
    assert same["labels"].shape == (3, 32)
    assert torch.equal(same["input_ids"], batch["input_ids"])  # the label length does not change the inputs
    causal = worst_case_batch(2, 16, 100, encoder_decoder=False, label_length=4)
    assert torch.equal(causal["labels"], causal["input_ids"])


def test_job_settings_default_to_the_input_length() -> None:
    assert JobSettings().label_length(128) == 128 and JobSettings().generation_length(128) == 128
    job = JobSettings(max_target_length=16, generation_max_length=24, num_beams=2)
    assert job.label_length(128) == 16 and job.generation_length(128) == 24
    assert JobSettings(max_target_length=16).generation_length(128) == 16


def test_a_padding_free_batch_is_one_row_with_position_ids_restarting_at_each_sequence() -> None:
    """TRL 1.16's padding-free collator: the rows concatenated, position_ids from 0 at each sequence, labels -100 where
    one starts, no attention_mask; a BFD row holds several samples (here two)."""
    from trials.data import batch_dims

    rows = worst_case_batch(3, 8, 100, encoder_decoder=False, padding_free="rows")
    assert set(rows) == {"input_ids", "labels", "position_ids"} and rows["input_ids"].shape == (1, 24)
    assert rows["position_ids"][0].tolist() == list(range(8)) * 3
    assert (rows["labels"] == -100).sum() == 3 and rows["labels"][0, 1] == rows["input_ids"][0, 1]
    bfd = worst_case_batch(2, 8, 100, encoder_decoder=False, padding_free="bfd")
    assert bfd["position_ids"][0].tolist() == [0, 1, 2, 3] * 4
    assert batch_dims(bfd, False, rows=2).input_length == 8 and not batch_dims(bfd, False, rows=2).padded
    assert JobSettings(padding_free="bfd").padding_free == "bfd"
