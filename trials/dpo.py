"""DPO's training step as TRL 1.16.0's DPOTrainer runs it (trl/trainer/dpo_trainer.py; TRL is not a dependency: the
math is here, each piece citing the lines it mirrors), for a job whose JobSettings.dpo is set.

- the pairs (``pairs``): chosen and rejected concatenated as one batch of 2 x micro rows ("batch is [chosen,
  rejected]", DataCollatorForPreference), each row prompt + completion at the job's length, a ``completion_mask`` over
  the completion (the collator's; here the rows' second half), and under ``precompute_ref_log_probs`` the dataset's
  ``ref_chosen_logps`` / ``ref_rejected_logps`` columns (one number per pair);
- the policy's per-row log-probs of the completion tokens, summed (``_compute_loss``: ``per_token_logps.sum(dim=1)``
  with labels -100 outside the completion mask). TRL 1.16 computes them through its fused, tiled LM head, which never
  holds the (rows, length, vocabulary) logits: with JobSettings.trl_head set the step calls it too, the model patched
  with TRL's own ``add_fused_lm_head`` (trials.trl_head); without it (TRL not installed beside tuner) the step holds
  the full logits (the model's own head, then a gather and a logsumexp), as TRL < 1.16 did;
- the reference log-probs (``reference``): a frozen reference model's forward under ``torch.no_grad()`` (DPOTrainer
  builds it at dpo_trainer.py:908-927, a second copy of the model in the policy's dtype, and prepares it for the
  engine at 984-990: ``prepare_deepspeed`` without an optimizer, ZeRO stage 0 unless the policy's is 3;
  ``accelerator.prepare_model(evaluation_mode=True)`` without DeepSpeed), or for a PEFT policy the same model with
  its adapter disabled (``use_adapter(..., None)``: no second model), or none under ``precompute_ref_log_probs``
  (the batch carries them);
- the sigmoid loss: ``-logsigmoid(beta * ((chosen - ref_chosen) - (rejected - ref_rejected)))``, averaged over pairs
  (``loss_type`` "sigmoid", ``f_divergence_type`` "reverse_kl").
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from trials.contract import DpoSpec

Batch = dict[str, torch.Tensor]
_NON_MODEL_KEYS = ("completion_mask", "ref_chosen_logps", "ref_rejected_logps", "labels")  # dpo_trainer.py:1289


def pairs(batch: Batch, spec: DpoSpec) -> Batch:
    """A batch of 2 x micro rows (chosen rows, then rejected rows) as DPO's collator hands it to the step: its
    ``completion_mask`` (the prompt, the rows' first half, is 0; padding is 0) and, under ``precompute_ref_log_probs``,
    the precomputed reference log-probs of each pair (float32, one per pair, as the dataset's columns)."""
    ids = batch["input_ids"]
    mask = batch["attention_mask"].clone()
    mask[:, : ids.shape[1] // 2] = 0
    out = {"input_ids": ids, "attention_mask": batch["attention_mask"], "completion_mask": mask}
    if spec.reference == "precomputed":
        half = ids.shape[0] // 2
        out["ref_chosen_logps"] = torch.zeros(half, dtype=torch.float32, device=ids.device)
        out["ref_rejected_logps"] = torch.zeros(half, dtype=torch.float32, device=ids.device)
    return out


def sequence_logps(model: Any, batch: Batch, fused: bool = False) -> torch.Tensor:
    """Each row's log-probability of its completion tokens, summed (dpo_trainer.py:1296-1304: labels are the input
    ids masked to -100 outside the completion, shifted by one; ``per_token_logps.sum(dim=1)``); ``fused``: through
    TRL's fused LM head (``fused_lm_head=True``: the model patched by trials.trl_head.fuse), as DPOTrainer does."""
    inputs = {k: v for k, v in batch.items() if k not in _NON_MODEL_KEYS}
    if fused:
        labels = batch["input_ids"].masked_fill(batch["completion_mask"] == 0, -100)
        outputs = model(**inputs, labels=labels, use_cache=False, fused_lm_head=True)
        return outputs.log_probs[:, -(batch["completion_mask"].shape[1] - 1) :].sum(dim=1)
    logits = model(**inputs, use_cache=False).logits[:, :-1]
    labels = batch["input_ids"][:, 1:]
    keep = batch["completion_mask"][:, 1:].to(torch.bool)
    picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1).float()
    per_token = picked - torch.logsumexp(logits.float(), dim=-1)
    return (per_token * keep).sum(dim=1)


def sigmoid_loss(
    beta: float, chosen: torch.Tensor, rejected: torch.Tensor, ref_chosen: torch.Tensor, ref_rejected: torch.Tensor
) -> torch.Tensor:
    """DPO's sigmoid loss over the pairs (dpo_trainer.py:1353-1356 "reverse_kl" scores, 1383-1388 "sigmoid", 1528),
    averaged as the trainer averages its per-sequence loss."""
    delta = (chosen - ref_chosen) - (rejected - ref_rejected)
    return (-F.logsigmoid(beta * delta)).mean()


def reference_logps(
    spec: DpoSpec, policy: Any, reference: Any | None, batch: Batch, fused: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's (chosen, rejected) log-probs (dpo_trainer.py:1318-1347): the batch's precomputed columns; else
    under ``torch.no_grad()`` the reference model's forward, or the policy's with its adapter disabled (PEFT)."""
    if spec.reference == "precomputed":
        return batch["ref_chosen_logps"], batch["ref_rejected_logps"]
    with torch.no_grad():
        if spec.reference == "adapter":
            with _peft_of(policy).disable_adapter():
                logps = sequence_logps(policy, batch, fused)
        else:
            assert reference is not None, "a DPO job with a reference model needs one built"
            logps = sequence_logps(reference, batch, fused)
    ref_chosen, ref_rejected = logps.chunk(2, dim=0)
    return ref_chosen, ref_rejected


def dpo_loss(spec: DpoSpec, reference: Any | None, policy: Any, batch: Batch, fused: bool = False) -> torch.Tensor:
    """One micro-step's DPO loss (``DPOTrainer._compute_loss``): the policy's forward over the pairs, the reference's,
    the sigmoid loss; ``fused``: the log-probs through TRL's fused LM head."""
    chosen, rejected = sequence_logps(policy, batch, fused).chunk(2, dim=0)  # batch is [chosen, rejected]
    ref_chosen, ref_rejected = reference_logps(spec, policy, reference, batch, fused)
    return sigmoid_loss(spec.beta, chosen, rejected, ref_chosen, ref_rejected)


def loss_of(spec: DpoSpec, reference: Any | None, fused: bool = False) -> Callable[[Any, Batch], torch.Tensor]:
    """What an engine calls as its loss (``engine.loss(module, batch)``) for a DPO job (``fused``: TRL's head)."""
    return functools.partial(dpo_loss, spec, reference, fused=fused)


def _peft_of(module: Any) -> Any:
    """The PeftModel under an engine's wrappers (DeepSpeed's engine, DDP: ``.module``), whose ``disable_adapter``
    turns the reference on (TRL: ``accelerator.unwrap_model(self.model)``)."""
    while not hasattr(module, "disable_adapter") and hasattr(module, "module"):
        module = module.module
    return module


def frozen(model: torch.nn.Module) -> torch.nn.Module:
    """The reference model as DPOTrainer keeps it: eval mode, no parameter requiring grad."""
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def reference_deepspeed_config(config: dict[str, Any]) -> dict[str, Any]:
    """The DeepSpeed JSON TRL's ``prepare_deepspeed`` (trl/models/utils.py:246-289) initialises the reference model
    with, from the policy's: no optimizer, scheduler or optimizer offload; ZeRO stage 0 unless the policy's is 3
    (then the reference is sharded too)."""
    ds = copy.deepcopy(config)
    ds.pop("optimizer", None)
    ds.pop("scheduler", None)
    zero = ds.setdefault("zero_optimization", {})
    zero.pop("offload_optimizer", None)
    if zero.get("stage", 0) != 3:
        zero["stage"] = 0
    return ds


def prepare_reference(model: torch.nn.Module | None, engine: Any, device: torch.device) -> Any | None:
    """The frozen reference model prepared for ``engine`` as DPOTrainer prepares it: a DeepSpeed engine of its own
    (``prepare_deepspeed``) under DeepSpeed, else on the device in fp32 (the policy's dtype; the step's autocast
    runs the precision, as ``accelerator.prepare_model(evaluation_mode=True)`` leaves it)."""
    if model is None:
        return None
    frozen(model)
    ds_config = getattr(engine, "config", None)
    if type(engine).__name__ == "DeepSpeedEngine" and isinstance(ds_config, dict):
        import deepspeed

        ref, *_ = deepspeed.initialize(model=model, config=reference_deepspeed_config(ds_config))
        ref.eval()
        return ref
    return model.to(device)


def reference_model(config: Any, encoder_decoder: bool, build: Callable[[], torch.nn.Module]) -> Any | None:
    """A DPO job's frozen reference model, built as the policy is (without its adapters: DPOTrainer loads the model
    again), when its reference is a model; None otherwise. What the probe does not run is refused in one line."""
    from trials.outcome import ConfigRefused

    spec = config.job.dpo
    if spec is None:
        return None
    if encoder_decoder:
        raise ConfigRefused("DPO's step is probed for causal LMs (TRL 1.16's DPOTrainer trains them): not this model")
    if spec.reference != "model":
        return None
    if config.knobs.engine == "fsdp2":
        raise ConfigRefused(
            "DPO's reference model under FSDP2 (TRL's prepare_fsdp) is not probed yet: search engine deepspeed or "
            "torch, or set precompute_ref_log_probs (no reference model in the step)"
        )
    return frozen(build())
