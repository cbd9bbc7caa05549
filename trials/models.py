"""Model sources: built-in T5 and Llama-shaped presets (random init from a config, no download), HF hub ids, local
directories."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Literal

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedModel,
    T5Config,
)

from trials.contract import BUILTIN_PREFIX, BUILTIN_PRESETS, Knobs, ModelSpec, trusts_remote_code

# Where a probe builds its model: "zero-init" partitions it across the ranks while it is built (ZeRO-3 under
# deepspeed.zero.Init, as the HF Trainer does: no rank ever holds the whole model); "device" builds (and random-inits)
# it directly on the GPU, with no CPU init and no host->device copy; "host" builds it on the CPU (the emulated device,
# whose tracker counts the module's tensors).
Placement = Literal["zero-init", "device", "host"]


_TRAINING_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def build_dtype(knobs: Knobs, where: Placement) -> torch.dtype:
    """The dtype a probe builds its model in. DeepSpeed casts the module to its training precision before it moves it
    (the Trainer's path: the fp32 model never sits on the GPU); a probe building on the device builds in that
    precision at once, so the device never holds 4 bytes/param first (whose freed blocks would stay cached and count
    in the reserve). The plain torch engine trains an fp32 model under autocast: fp32. On the host (the emulated CPU
    device) the model is built as before, in fp32, and DeepSpeed casts it."""
    if knobs.engine == "deepspeed" and where in ("device", "zero-init"):
        return _TRAINING_DTYPES.get(knobs.precision, torch.float32)
    return torch.float32


def dtype_kwarg() -> str:
    """The keyword ``from_pretrained`` / ``from_config`` take the dtype as: ``dtype`` from transformers 4.56,
    ``torch_dtype`` before."""
    import transformers

    parts = [int(p) if p.isdigit() else 0 for p in transformers.__version__.split(".")[:2]]
    return "dtype" if tuple(parts) >= (4, 56) else "torch_dtype"


def placement(knobs: Knobs, device_type: str) -> Placement:
    """Where to build the model for these knobs on this device type (see ``Placement``)."""
    if device_type != "cuda" or knobs.engine == "fsdp2":
        return "host"  # FSDP2: accelerate shards a host model, fully_shard moving each group's shard to the device
    if knobs.engine == "deepspeed" and knobs.zero_stage == 3:
        return "zero-init"
    return "device"


PRESETS: dict[str, dict[str, Any]] = {
    # a 1-rank CPU probe of this takes seconds
    "tiny-t5": dict(
        vocab_size=512,
        d_model=64,
        d_kv=16,
        d_ff=256,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        feed_forward_proj="relu",
        tie_word_embeddings=True,
    ),
    # the shape of google-t5/t5-small
    "t5-small": dict(
        vocab_size=32128,
        d_model=512,
        d_kv=64,
        d_ff=2048,
        num_layers=6,
        num_decoder_layers=6,
        num_heads=8,
        feed_forward_proj="relu",
        tie_word_embeddings=True,
    ),
    # the shape of google/flan-t5-large (for GPUs)
    "flan-t5-large": dict(
        vocab_size=32128,
        d_model=1024,
        d_kv=64,
        d_ff=2816,
        num_layers=24,
        num_decoder_layers=24,
        num_heads=16,
        feed_forward_proj="gated-gelu",
        tie_word_embeddings=False,
    ),
}
# Llama-shaped causal LMs (LlamaConfig): most fine-tuning today is of Llama/Qwen-shaped decoders
LLAMA_PRESETS: dict[str, dict[str, Any]] = {
    # a 1-rank CPU probe of this takes seconds
    "tiny-llama": dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=172,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    ),
    # the shape of TinyLlama-1.1B / Llama-3.2-1B-class models (for GPUs)
    "llama-1b": dict(
        vocab_size=32000,
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=22,
        num_attention_heads=32,
        num_key_value_heads=4,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    ),
}
assert (*PRESETS, *LLAMA_PRESETS) == BUILTIN_PRESETS, "trials.contract.BUILTIN_PRESETS must list the presets"
_LLAMA_COMMON = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, use_cache=False)

_COMMON = dict(dropout_rate=0.1, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, use_cache=False)


def load_config(spec: ModelSpec) -> PretrainedConfig:
    """The model's config with ``spec.overrides`` applied. Raises ValueError for an unknown source."""
    source = spec.source
    if source.startswith(BUILTIN_PREFIX):
        name = source[len(BUILTIN_PREFIX) :]
        if name in LLAMA_PRESETS:
            config: PretrainedConfig = LlamaConfig(**{**_LLAMA_COMMON, **LLAMA_PRESETS[name]})
        elif name in PRESETS:
            config = T5Config(**{**_COMMON, **PRESETS[name]})
            # transformers 5's T5Config forces tie_word_embeddings=True whatever it is given; flan-t5 unties its
            # lm_head (32,128 x 1,024 = 33M params of flan-t5-large): set the preset's value after construction
            # (from_config then unties the encoder/decoder input embeddings too: instantiate ties those back)
            config.tie_word_embeddings = PRESETS[name]["tie_word_embeddings"]
        else:
            raise ValueError(
                f"unknown built-in model {source!r}; choose one of "
                + ", ".join(BUILTIN_PREFIX + p for p in BUILTIN_PRESETS)
            )
    else:
        config = AutoConfig.from_pretrained(source, trust_remote_code=_consent())  # a folder's code: asked for only
    return _override(config, spec)


def _consent() -> bool:
    """The user's consent to run a folder's own code (trials.contract.TRUST_REMOTE_CODE_ENV); False: never, no
    prompt (transformers raises instead)."""
    return trusts_remote_code(os.environ)


def _override(config: PretrainedConfig, spec: ModelSpec) -> PretrainedConfig:
    """``spec.overrides`` applied to the config; training settings (no KV cache)."""
    source = spec.source
    for key, value in spec.overrides.items():
        if not hasattr(config, key):
            raise ValueError(f"model config of {source!r} has no field {key!r} to override")
        setattr(config, key, value)
    if getattr(config, "use_cache", None) is not None:
        config.use_cache = False  # training: no KV cache
    return config


def instantiate(config: PretrainedConfig, dtype: torch.dtype | None = None) -> PreTrainedModel:
    """``AutoModel*.from_config`` (seq2seq or causal by the config), as the published model is laid out: a T5 with an
    untied lm_head keeps its encoder and decoder input embeddings tied to ``shared`` (transformers 5 unties all
    three when ``tie_word_embeddings`` is False; google/flan-t5-large has one shared input embedding)."""
    auto = AutoModelForSeq2SeqLM if getattr(config, "is_encoder_decoder", False) else AutoModelForCausalLM
    kwargs: dict[str, Any] = {"trust_remote_code": _consent()}  # an auto_map imports only when asked for, no prompt
    if dtype is not None:
        kwargs[dtype_kwarg()] = dtype
    model = auto.from_config(config, **kwargs)
    shared = getattr(model, "shared", None)
    if isinstance(shared, torch.nn.Embedding):
        for stack in (getattr(model, "encoder", None), getattr(model, "decoder", None)):
            embed = getattr(stack, "embed_tokens", None)
            if isinstance(embed, torch.nn.Embedding) and embed.weight is not shared.weight:
                embed.weight = shared.weight
    return model


def build_model(
    spec: ModelSpec,
    *,
    where: Placement = "host",
    device: torch.device | None = None,
    zero_config: dict[str, Any] | None = None,
    dtype: torch.dtype = torch.float32,
) -> PreTrainedModel:
    """A seq2seq LM (or a causal LM for decoder-only configs) in ``dtype`` (``build_dtype``), in train mode, built
    ``where`` says.

    Built-in presets and hub ids are randomly initialised from their config (weights do not change memory or speed);
    a local ``save_pretrained`` directory without overrides loads its weights. "zero-init" needs ``zero_config`` (the
    probe's DeepSpeed JSON) and an initialised process group: as under the Trainer, an ``HfDeepSpeedConfig`` is kept
    alive with the model, so transformers itself builds it under ``deepspeed.zero.Init`` (with its own guards: no
    weight init on partitioned params, RoPE buffers, a checkpoint's weights gathered in); "device" needs ``device``.
    """
    config = load_config(spec)
    auto = AutoModelForSeq2SeqLM if getattr(config, "is_encoder_decoder", False) else AutoModelForCausalLM
    local = not spec.source.startswith(BUILTIN_PREFIX) and Path(spec.source).is_dir()
    context: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    hf_ds_config = None
    if where == "zero-init":
        from transformers.integrations import HfDeepSpeedConfig

        if zero_config is None:
            raise ValueError("building under deepspeed.zero.Init needs the probe's DeepSpeed config")
        hf_ds_config = HfDeepSpeedConfig(zero_config)  # transformers holds a weak reference: kept with the model
    elif where == "device" and device is not None:
        context = torch.device(device)
    kwargs: dict[str, Any] = {dtype_kwarg(): dtype, "trust_remote_code": _consent()}
    with context:
        if local and not spec.overrides:
            model = auto.from_pretrained(spec.source, config=config, **kwargs)
        else:
            model = instantiate(config, dtype=dtype)
    if where == "device" and device is not None:
        model = model.to(device)  # type: ignore[arg-type]  # from_pretrained loads on the host: one copy
    if hf_ds_config is not None:
        model._tuner_hf_deepspeed_config = hf_ds_config  # alive as long as the model (and its engine)
    model.train()
    return model


def is_encoder_decoder(model: torch.nn.Module) -> bool:
    return bool(getattr(getattr(model, "config", None), "is_encoder_decoder", False))
