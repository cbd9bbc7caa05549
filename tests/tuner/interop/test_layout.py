"""The exported JSON's layout: what json.loads reads back is the same value; lines fit the width where they can."""

import json

from tuner.interop.export import layout

DS = {
    "train_batch_size": 32,
    "train_micro_batch_size_per_gpu": 8,
    "zero_optimization": {
        "stage": 3,
        "reduce_bucket_size": 10**7,
        "stage3_prefetch_bucket_size": "auto",
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
    },
    "fp16": {"enabled": False},
    "optimizer": {"type": "AdamW", "params": {"lr": 2e-5, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}},
    "empty": {},
    "none": [],
    "note": "text with [markup] and \u00e9",
}


def test_the_layout_reads_back_as_the_same_value_one_top_level_key_per_line():
    text = layout.dumps(DS)
    assert json.loads(text) == DS and text.endswith("}\n")
    lines = text.splitlines()
    assert lines[0] == "{" and lines[-1] == "}"
    assert '  "fp16": {"enabled": false},' in lines  # a small section on one line
    assert '    "offload_optimizer": {"device": "cpu", "pin_memory": true}' in lines  # nested: one line when it fits
    assert all(len(line) <= 100 for line in lines)
    assert len(lines) < len(json.dumps(DS, indent=2).splitlines()) / 2 + 3


def test_a_narrow_width_opens_everything_that_does_not_fit():
    text = layout.dumps(DS, width=30)
    assert json.loads(text) == DS
    long = [line for line in text.splitlines() if len(line) > 30 and '"note"' not in line]
    assert long and all(not any(c in line for c in "{[") for line in long)  # only a key and its scalar: no break


def test_scalars_and_empty_values_at_the_top():
    assert layout.dumps(3) == "3\n" and layout.dumps([]) == "[]\n" and layout.dumps({}) == "{}\n"
    assert layout.dumps([1, {"a": 2}]) == '[\n  1,\n  {"a": 2}\n]\n'
