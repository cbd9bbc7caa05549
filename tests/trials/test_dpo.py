"""trials.dpo: DPO's step as TRL 1.16's DPOTrainer runs it (the pairs, the completion log-probs, the sigmoid loss, the
reference: a frozen model, the PEFT adapter disabled, or precomputed), and a probe of it holding what it should."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from trials.contract import DpoSpec, JobSettings, Knobs, LoraSpec, ModelSpec, ProbeConfig
from trials.data import worst_case_batch
from trials.dpo import dpo_loss, frozen, pairs, reference_deepspeed_config, reference_model, sequence_logps
from trials.lora import apply_lora
from trials.models import build_model
from trials.outcome import ConfigRefused

LLAMA = ModelSpec(source="builtin:tiny-llama")
LORA = LoraSpec(r=4, alpha=8, target_modules=("q_proj", "v_proj"))


def _pairs(spec: DpoSpec, micro: int = 2, length: int = 12) -> dict[str, torch.Tensor]:
    return pairs(worst_case_batch(2 * micro, length, 512, seed=0, encoder_decoder=False), spec)


def _by_hand(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
    logp = F.log_softmax(logits.float(), -1).gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
    return (logp * batch["completion_mask"][:, 1:]).sum(1)


def test_the_pairs_are_chosen_then_rejected_rows_with_the_completion_masked_in() -> None:
    batch = _pairs(DpoSpec(), micro=3, length=10)
    assert batch["input_ids"].shape == (6, 10)  # 2 x micro rows
    assert batch["completion_mask"][:, :5].sum() == 0 and bool(batch["completion_mask"][:, 5:].all())
    assert "ref_chosen_logps" not in batch
    pre = _pairs(DpoSpec(reference="precomputed"), micro=3)
    assert pre["ref_chosen_logps"].shape == (3,) and pre["ref_rejected_logps"].shape == (3,)


def test_the_loss_is_the_sigmoid_loss_over_the_completions_log_probs_against_the_reference() -> None:
    torch.manual_seed(0)
    policy, reference = build_model(LLAMA), frozen(build_model(LLAMA))
    batch = _pairs(DpoSpec(beta=0.3))
    loss = dpo_loss(DpoSpec(beta=0.3), reference, policy, batch)
    pc, pr = _by_hand(policy, batch).chunk(2)
    with torch.no_grad():
        rc, rr = _by_hand(reference, batch).chunk(2)
    assert torch.allclose(loss, -F.logsigmoid(0.3 * ((pc - rc) - (pr - rr))).mean(), atol=1e-5)
    loss.backward()
    assert all(p.grad is None for p in reference.parameters())  # frozen: no grad reaches the reference
    assert sum(p.grad is not None for p in policy.parameters()) > 0
    assert torch.allclose(sequence_logps(policy, batch), _by_hand(policy, batch), atol=1e-4)


def test_a_peft_policys_reference_is_the_model_with_its_adapter_disabled() -> None:
    torch.manual_seed(0)
    base = build_model(LLAMA)
    plain = {k: v.clone() for k, v in base.state_dict().items()}
    policy = apply_lora(base, LORA)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_()  # the adapters now change the output (peft starts them at zero)
    batch = _pairs(DpoSpec(reference="adapter"))
    twin = build_model(LLAMA)
    twin.load_state_dict(plain)
    with torch.no_grad():
        with policy.disable_adapter():
            disabled = sequence_logps(policy, batch)
        assert torch.allclose(disabled, sequence_logps(twin, batch), atol=1e-4)
        assert not torch.allclose(disabled, sequence_logps(policy, batch), atol=1e-2)
    loss = dpo_loss(DpoSpec(reference="adapter"), None, policy, batch)
    assert loss.requires_grad


def test_the_reference_deepspeed_config_is_prepare_deepspeeds() -> None:
    policy = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}, "optimizer": {"type": "AdamW"}}
    assert reference_deepspeed_config(policy) == {"zero_optimization": {"stage": 0}}
    assert reference_deepspeed_config({"zero_optimization": {"stage": 3}})["zero_optimization"]["stage"] == 3


def test_what_the_probe_does_not_run_is_refused_in_one_line_and_no_second_model_is_built_without_one() -> None:
    def config(engine: str, reference: str = "model") -> ProbeConfig:
        knobs = Knobs(micro_batch_size=1, max_length=8, engine=engine)
        return ProbeConfig(model=LLAMA, knobs=knobs, job=JobSettings(dpo=DpoSpec(reference=reference)))

    with pytest.raises(ConfigRefused, match="reference model under FSDP2"):
        reference_model(config("fsdp2"), False, lambda: build_model(LLAMA))
    with pytest.raises(ConfigRefused, match="causal LMs"):
        reference_model(config("torch"), True, lambda: build_model(LLAMA))
    for reference in ("adapter", "precomputed"):
        assert reference_model(config("fsdp2", reference), False, lambda: pytest.fail("built a second model")) is None
    built = reference_model(config("torch"), False, lambda: build_model(LLAMA))
    assert built is not None and not built.training and not any(p.requires_grad for p in built.parameters())


def _peak(tmp_path: Path, name: str, job: JobSettings) -> int:
    knobs = Knobs(micro_batch_size=2, max_length=64, engine="torch")
    config = ProbeConfig(model=LLAMA, knobs=knobs, job=job, warmup_steps=2, measure_steps=2)
    path, out = tmp_path / f"{name}.json", tmp_path / f"{name}.out.json"
    path.write_text(config.model_dump_json())
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, "-m", "trials", "--config", str(path), "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    result = json.loads(out.read_text())
    assert done.returncode == 0 and result["status"] == "ok", (done.stderr[-2000:], result.get("cause"))
    return int(result["memory"]["peak_allocated"])


@pytest.mark.slow
def test_a_probe_holds_the_reference_model_unless_peft_or_precomputed(tmp_path: Path) -> None:
    params = sum(p.numel() * 4 for p in build_model(LLAMA).parameters())  # fp32, as the probe builds it
    sft = _peak(tmp_path, "sft", JobSettings())
    model = _peak(tmp_path, "model", JobSettings(dpo=DpoSpec()))
    pre = _peak(tmp_path, "pre", JobSettings(dpo=DpoSpec(reference="precomputed")))
    assert model - pre >= params  # the second copy's parameters, and its forward's transients
    assert pre > sft  # the doubled rows
    lora_copy = _peak(tmp_path, "lora-copy", JobSettings(lora=LORA, dpo=DpoSpec(reference="model")))
    adapter = _peak(tmp_path, "adapter", JobSettings(lora=LORA, dpo=DpoSpec(reference="adapter")))
    assert lora_copy - adapter >= params  # a PEFT policy's reference holds no second model
