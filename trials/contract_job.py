"""The probe contract's job half: what the user's job fixes that a probe needs beside the knobs (JobSettings: label
and generation lengths, clipping, LoRA adapters, their training args as the probe's TrainingArguments are built from
them), and the FSDP2 settings a search holds. Re-exported by trials.contract, which tuner/ imports alone."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from trials.contract_batches import Strict

FsdpWrap = Literal["TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"]


LoraBias = Literal["none", "all", "lora_only"]
#: a TRL SFT recipe's padding-free collation (tuner.job.packing): "bfd", BFD packing's rows of several samples each;
#: "rows", padding_free over wrapped rows (a sequence a row)
PaddingFree = Literal["bfd", "rows"]


class LoraSpec(Strict):
    """LoRA adapters on the base model (peft.LoraConfig's fields, its defaults): the user's job setting, held fixed.

    Every probe of a LoRA job wraps the model with ``peft.get_peft_model`` before its engine is built (trials.lora),
    so only the adapters train and the optimizer holds only their states. ``target_modules`` empty: peft's default
    for the architecture (Llama: q_proj, v_proj; T5: q, v)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    r: int = Field(ge=1, description="rank of the adapters")
    alpha: int = Field(8, ge=1, description="lora_alpha: the adapters' scale is alpha / r")
    dropout: float = Field(0.0, ge=0, lt=1, description="lora_dropout")
    target_modules: tuple[str, ...] = Field((), description="module names to adapt; empty: peft's default")
    bias: LoraBias = Field("none", description="which biases train: none, all, lora_only")

    def describe(self) -> str:
        targets = ",".join(self.target_modules) or "peft's default modules"
        extra = f", dropout {self.dropout:g}" if self.dropout else ""
        extra += f", bias {self.bias}" if self.bias != "none" else ""
        return f"LoRA r {self.r} alpha {self.alpha} on {targets}{extra} (adapters train, base frozen)"


DpoReference = Literal["model", "adapter", "precomputed"]


class DpoSpec(Strict):
    """A DPO job (a TRL DPOConfig recipe, tuner.job.ledger.trl): every micro-step forwards chosen and rejected as one
    batch of 2 x micro rows and takes the sigmoid loss against reference log-probs (trials.dpo), which come from a
    frozen second copy of the model (``reference`` "model"), the PEFT policy with its adapter disabled ("adapter": no
    second model), or the data (``precompute_ref_log_probs``: "precomputed", no reference forward in the step)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    beta: float = Field(0.1, description="DPOConfig's beta (a value of the loss)")
    reference: DpoReference = Field("model", description="where the reference log-probs come from")

    def describe(self) -> str:
        said = {
            "model": "a frozen reference model (a second copy, no-grad forward)",
            "adapter": "the reference is the model with its adapter disabled (no second model)",
            "precomputed": "precomputed reference log-probs (no reference forward)",
        }[self.reference]
        return f"DPO pairs (chosen + rejected: 2 x micro rows), {said}"


class TrlHead(Strict):
    """TRL's fused LM head (``trl.trainer.utils.add_fused_lm_head``, TRL >= 1.16) as a TRL SFT / DPO recipe's trainer
    runs it: the probe patches the model with TRL's own function and takes the loss (SFT) or the per-token log-probs
    (DPO, policy and reference) through it, so it holds the head's tiles of min(tokens, 4096) x 32768 in place of the
    full logits (trials.trl_head). Set only where TRL is installed beside tuner (tuner.job.trl_head)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: str = Field(description="the TRL release installed beside tuner whose head the probe runs")
    outputs: tuple[str, ...] = Field(("log_probs",), description="add_fused_lm_head's outputs, as the trainer asks")


class JobSettings(Strict):
    """What the user's job fixes that a probe needs beside the knobs (tuner.job.definition.Job holds the rest)."""

    max_target_length: int | None = Field(None, ge=1, description="seq2seq label length; None: max_length")
    generation_max_length: int | None = Field(None, ge=1, description="new tokens of an eval generate; None: labels")
    num_beams: int = Field(1, ge=1, description="beams of an eval generate")
    max_grad_norm: float = Field(1.0, ge=0, description="gradient clipping without DeepSpeed (0: none), as the Trainer")
    lora: LoraSpec | None = Field(None, description="LoRA adapters every probe trains (None: a full fine-tune)")
    dpo: DpoSpec | None = Field(None, description="a DPO job's pairs and reference (None: one row per sample)")
    # the user's training args as the probe's TrainingArguments are built from them (trials.trainer_args): every
    # field of their file but those the probe sets itself (tuner.job.ledger.held.PROBE_SET); None: no training args
    # (a preset or flags alone: the Trainer's defaults)
    trainer_args: dict[str, Any] | None = Field(None, description="the user's TrainingArguments fields the probe runs")
    seq2seq_args: bool = Field(False, description="their file is Seq2SeqTrainingArguments")
    eval_held_batches: int = Field(
        0, ge=0, description="eval batches whose logits stay on the device (their eval loop's pile); 0: none kept"
    )
    compile: dict[str, Any] | None = Field(
        None, description="torch.compile's keywords from their accelerate config's dynamo_config (None: none)"
    )
    padding_free: PaddingFree | None = Field(
        None, description="a TRL SFT recipe's padding-free batches: each micro batch one flattened row (trials.data)"
    )
    trl_head: TrlHead | None = Field(None, description="TRL's fused LM head (None: the full logits)")

    def label_length(self, max_length: int) -> int:
        return self.max_target_length or max_length

    def generation_length(self, max_length: int) -> int:
        return self.generation_max_length or self.label_length(max_length)


class FsdpSettings(Strict):
    """The user's own FSDP2 settings a search holds fixed (their accelerate ``fsdp_config`` / TrainingArguments'
    ``fsdp_config``, without the tuned knobs): how blocks are wrapped, and what moves save memory, not training."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    auto_wrap_policy: FsdpWrap = Field("TRANSFORMER_BASED_WRAP", description="accelerate's fsdp_auto_wrap_policy")
    transformer_layer_cls_to_wrap: tuple[str, ...] = Field(
        (), description="block classes each sharded on their own; empty: the model's _no_split_modules"
    )
    min_num_params: int = Field(100_000_000, ge=0, description="SIZE_BASED_WRAP's threshold (accelerate's default)")
    state_dict_type: str = Field("SHARDED_STATE_DICT", description="held as given: it moves save memory only")
    cpu_ram_efficient_loading: bool = Field(True, description="rank 0 loads, others get its weights (host memory)")
