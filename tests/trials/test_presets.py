"""The built-in presets are the models they name: their parameter counts are the published models'."""

from __future__ import annotations

import pytest
import torch

from trials.contract import ModelSpec
from trials.models import instantiate, load_config

# The published models' parameter counts, from their configs on the Hugging Face hub (config.json of
# google/flan-t5-large, google-t5/t5-small, TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T), counted by
# sum(p.numel() for p in model.parameters()) as transformers builds them (tied weights once).
PUBLISHED = {
    "flan-t5-large": 783_150_080,  # untied lm_head
    "t5-small": 60_506_624,  # tied lm_head
    "llama-1b": 1_100_048_384,  # TinyLlama-1.1B's shape, untied lm_head
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_has_the_published_parameter_count(name: str) -> None:
    config = load_config(ModelSpec(source=f"builtin:{name}"))
    with torch.device("meta"):  # shapes only: no memory, no init cost; built as every probe and trace builds it
        model = instantiate(config)
    assert sum(p.numel() for p in model.parameters()) == PUBLISHED[name]
