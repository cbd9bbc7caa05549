"""trials.lora: a LoRA job's probe model is the base with peft adapters, and only the adapters train."""

from __future__ import annotations

import pytest
import torch

from trials.contract import JobSettings, Knobs, LoraSpec, ModelSpec, ProbeConfig
from trials.data import worst_case_batch
from trials.engine import build_engine
from trials.lora import apply_lora, trainable_count
from trials.models import build_model

LLAMA = ModelSpec(source="builtin:tiny-llama")
LORA = LoraSpec(r=4, alpha=8, target_modules=("q_proj", "v_proj"))


@pytest.mark.parametrize("reentrant", [False, True])
def test_the_adapters_train_and_the_base_stays_frozen_under_checkpointing(reentrant: bool) -> None:
    torch.manual_seed(0)
    model = apply_lora(build_model(LLAMA), LORA)
    knobs = Knobs(micro_batch_size=2, max_length=16, engine="torch", gradient_checkpointing=True)
    config = ProbeConfig(knobs=knobs, job=JobSettings(lora=LORA))
    engine = build_engine(model, config, accum=1, device=torch.device("cpu"), world_size=1)
    if reentrant:  # the old default: without inputs that require grad, no gradient reaches the adapters
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    batch = worst_case_batch(2, 16, int(model.config.vocab_size), seed=0, encoder_decoder=False)
    for _ in range(2):
        assert engine.micro_step(batch)  # accum 1: every micro-step is an optimizer step
    changed = {name for name, p in model.named_parameters() if not torch.equal(p, before[name])}
    adapters = {name for name, p in model.named_parameters() if p.requires_grad}
    assert adapters and all(".lora_A." in n or ".lora_B." in n for n in adapters)
    assert changed == adapters  # every adapter weight moved, no base weight did
    # the optimizer holds state for the adapters only: the frozen base has no moments
    state = engine.optimizer.state  # type: ignore[attr-defined]
    assert sum(s["exp_avg"].numel() for s in state.values()) == trainable_count(model)
    assert trainable_count(model) == 2 * 4 * ((64 + 64) + (64 + 32))  # 2 layers x r x (q: in + out, v: in + out)


def test_a_target_module_the_model_lacks_names_its_linear_layers() -> None:
    with pytest.raises(ValueError, match=r"LoRA target module q not in the model; its linear layers are .*q_proj"):
        apply_lora(build_model(LLAMA), LoraSpec(r=4, target_modules=("q",)))


def test_no_target_modules_is_pefts_default_for_the_architecture() -> None:
    t5 = apply_lora(build_model(ModelSpec(source="builtin:tiny-t5")), LoraSpec(r=2))  # peft's T5 default: q, v
    names = {n for n, p in t5.named_parameters() if p.requires_grad}
    assert names and all(".q.lora_" in n or ".v.lora_" in n for n in names)
