"""The fake-tensor memory trace: it matches the same step on real tensors, and moves the right way with each knob."""

from __future__ import annotations

import pytest

from trials.contract import ModelSpec
from trials.estimate import run, trace_point

TINY = ModelSpec(source="builtin:tiny-t5")


@pytest.mark.slow
def test_fake_trace_matches_real_tensors() -> None:
    import torch

    torch.manual_seed(0)
    fake = trace_point(TINY, 4, 64, False, "fp32", fake=True)
    real = trace_point(TINY, 4, 64, False, "fp32", fake=False)
    assert fake["param_count"] == real["param_count"] > 0
    assert fake["param_bytes"] == real["param_bytes"] == 4 * real["param_count"]
    for key in ("activation_bytes", "resident_activation_bytes", "step_temp_bytes", "peak_bytes"):
        assert fake["point"][key] == pytest.approx(real["point"][key], rel=0.02), key


@pytest.mark.slow
def test_trace_moves_with_the_knobs() -> None:
    out = run(
        {
            "model": TINY.model_dump(),
            "points": [
                {"micro_batch_size": 2, "max_length": 64},
                {"micro_batch_size": 4, "max_length": 64},
                {"micro_batch_size": 4, "max_length": 128},
                {"micro_batch_size": 4, "max_length": 64, "gradient_checkpointing": True},
            ],
        }
    )
    p2, p4, p4long, p4ckpt = (p["activation_bytes"] for p in out["points"])
    assert 1.6 < p4 / p2 < 2.4  # activations scale with the micro batch
    assert p4long > 1.6 * p4  # and at least linearly with the length
    assert p4ckpt < 0.6 * p4  # checkpointing drops most saved activations
    grads, one = 4 * out["param_count"], 4 * out["largest_param"]
    for p in out["points"]:  # an accumulation micro-step peaks with (nearly) all grads resident on top, plus at most
        # the one new grad being added in
        assert p["activation_bytes"] < p["resident_activation_bytes"] <= p["activation_bytes"] + grads + one
    assert out["param_count"] > 0 and out["largest_param"] <= out["param_count"]
    # the plain-torch step peak is params + grads + AdamW state (16 bytes/param) + activations at least
    assert out["points"][1]["peak_bytes"] >= 16 * out["param_count"]


def test_unknown_builtin_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown built-in model"):
        run({"model": {"source": "builtin:no-such-model"}, "points": [{"micro_batch_size": 1, "max_length": 8}]})


def test_seq2seq_labels_are_traced_at_the_jobs_label_length() -> None:
    """The probe pads labels to the job's label length; the trace does too, or it over-estimates (and prunes)."""
    spec = ModelSpec(source="builtin:tiny-t5")
    full = trace_point(spec, 4, 64, False, "fp32")["point"]
    short = trace_point(spec, 4, 64, False, "fp32", label_length=8)["point"]
    assert short["activation_bytes"] < full["activation_bytes"]


def test_a_mixed_precision_trace_measures_autocasts_weight_copies_apart_from_the_eval_batch() -> None:
    """Under autocast the eval forward's peak holds the weights' bf16 copies (2 bytes a matmul weight) whatever the
    batch; the trace records them as ``autocast_cache_bytes`` so the estimate scales only the rest."""
    evaluation = {"eval_batch_size": 1, "generate": False}
    one = trace_point(TINY, 2, 32, False, "bf16", label_length=8, evaluation=evaluation)
    four = trace_point(TINY, 2, 32, False, "bf16", label_length=8, evaluation={**evaluation, "eval_batch_size": 4})
    copies = one["point"]["autocast_cache_bytes"]
    assert 0 < copies <= 2 * one["param_count"] and copies > one["param_count"]  # most weights, at 2 bytes
    assert four["point"]["autocast_cache_bytes"] == pytest.approx(copies, rel=0.01)  # not the batch's
    per_sample = one["point"]["eval_bytes"] - copies
    assert four["point"]["eval_bytes"] - copies == pytest.approx(4 * per_sample, rel=0.05)
    assert "autocast_cache_bytes" not in trace_point(TINY, 2, 32, False, "fp32", evaluation=evaluation)["point"]


LLAMA = ModelSpec(source="builtin:tiny-llama")


@pytest.mark.slow
def test_causal_lm_fake_trace_matches_real_tensors_byte_for_byte() -> None:
    """transformers will not read a fake tensor's mask, so under FakeTensorMode it built a [batch, 1, len, len]
    mask per layer that the real all-ones batch never makes (SDPA's is_causal instead): the fake trace of a tiny
    Llama read 2.5 MiB (15%) high at micro 4, length 256. Decided as on real tensors, the two are equal to the byte,
    including the peaks from the first grad on."""
    fake = trace_point(LLAMA, 4, 256, False, "fp32", fake=True)["point"]
    real = trace_point(LLAMA, 4, 256, False, "fp32", fake=False)["point"]
    keys = ("activation_bytes", "resident_activation_bytes", "after_grad_activation_bytes", "step_temp_bytes")
    for key in (*keys, "resident_after_grad_activation_bytes", "peak_bytes"):
        assert fake[key] == real[key], key
    assert not any(a["shape"][-2:] == [256, 256] for a in fake["largest"]["forward_backward"])
    # the loss's log-softmax over the vocabulary peaks before any weight's grad exists
    assert fake["after_grad_activation_bytes"] < fake["activation_bytes"]


def test_the_mask_decision_is_restored_after_the_trace() -> None:
    from transformers import masking_utils

    before = masking_utils._ignore_causal_mask_sdpa
    trace_point(LLAMA, 1, 8, False, "fp32")
    assert masking_utils._ignore_causal_mask_sdpa is before


@pytest.mark.slow
def test_a_padded_causal_batch_builds_its_mask_in_the_trace_as_on_real_tensors() -> None:
    """The user's collator pads a shorter sample: the attention mask holds zeros, and a causal LM then builds its
    [batch, 1, len, len] mask (SDPA's CPU kernel converts it to fp32 per layer). The padded trace keeps it, fake
    and real alike; the unpadded one does not."""
    padded = trace_point(LLAMA, 4, 256, False, "fp32", fake=True, padded=True)["point"]
    real = trace_point(LLAMA, 4, 256, False, "fp32", fake=False, padded=True)["point"]
    plain = trace_point(LLAMA, 4, 256, False, "fp32", fake=True)["point"]
    assert padded["activation_bytes"] == real["activation_bytes"]
    mask_fp32 = 4 * 4 * 256 * 256  # [4, 1, 256, 256] fp32: at least one per layer's SDPA
    assert padded["activation_bytes"] >= plain["activation_bytes"] + mask_fp32


def test_a_padded_batch_marks_its_padding() -> None:
    from trials.data import batch_dims, worst_case_batch

    batch = worst_case_batch(3, 16, 512, encoder_decoder=False, padded=True)
    assert int(batch["attention_mask"].sum()) == 3 * 16 - 1 and int(batch["labels"][-1, -1]) == -100
    assert batch_dims(batch, encoder_decoder=False).padded
    assert not batch_dims(worst_case_batch(3, 16, 512, encoder_decoder=False), encoder_decoder=False).padded


_EXACT = (
    "activation_bytes",
    "resident_activation_bytes",
    "after_grad_activation_bytes",
    "resident_after_grad_activation_bytes",
    "step_temp_bytes",
    "peak_bytes",
    "eval_bytes",
    "generate_bytes",
    "generate_cache_bytes",
)


@pytest.mark.parametrize("cast_module", [False, True])
def test_a_bf16_trace_of_t5_matches_real_tensors_to_the_byte(cast_module: bool) -> None:
    """Issue 32. Both precision modes of a bf16 T5, with eval and generate: the fake trace allocates what real tensors
    do. Before: T5's encoder mask decision (``_ignore_bidirectional_mask_sdpa``) refused fake tensors, so the fake
    eval forward built a [batch, 1, len, len] mask the real one skips (4,096 bytes here; 11% of a bf16 eval phase on
    the tiny T5 at eval batch 8 x 64), and a cast module's fp32 master copies were counted as the batch."""
    evaluation = {"eval_batch_size": 4, "generate": True, "generation_max_length": 8}
    fake, real = (
        trace_point(TINY, 2, 32, False, "bf16", fake=f, label_length=16, evaluation=evaluation, cast_module=cast_module)
        for f in (True, False)
    )
    assert fake["param_bytes"] == real["param_bytes"] == (2 if cast_module else 4) * real["param_count"]
    assert fake["point"]["cast_module"] is cast_module
    for key in _EXACT:
        assert fake["point"][key] == real["point"][key], key


def test_deepspeed_bf16_is_traced_as_a_half_module_and_the_torch_engine_under_autocast() -> None:
    """The two bf16 modes differ where the issue said: the module cast to bf16 (DeepSpeed) keeps bf16 activations
    between the matmuls and no autocast weight copies; autocast over fp32 weights keeps the fp32 residual stream and a
    bf16 copy of every matmul weight (``autocast_cache_bytes``)."""
    evaluation = {"eval_batch_size": 4}
    autocast, cast = (
        trace_point(TINY, 4, 64, False, "bf16", label_length=16, evaluation=evaluation, cast_module=c)["point"]
        for c in (False, True)
    )
    assert autocast["autocast_cache_bytes"] > 0 and "autocast_cache_bytes" not in cast
    assert cast["activation_bytes"] < autocast["activation_bytes"]
    assert cast["eval_bytes"] < autocast["eval_bytes"]  # no weight copies held through the eval forward


def test_cuda_kernels_keep_bool_dropout_masks_and_the_biased_attention_on_the_math_path() -> None:
    """Issue 32: a GPU's kernels where their memory differs from the CPU's (trials.trace_modes.cuda_kernels). Fused
    dropout keeps a 1-byte mask where the CPU keeps a noise tensor of the input's dtype: less in the train step; T5's
    biased attention runs CUDA's math path in eval (fp32 scores and softmax), where the CPU runs its flash kernel."""
    evaluation = {"eval_batch_size": 4}
    cpu, cuda = (
        trace_point(TINY, 2, 32, False, "bf16", label_length=16, evaluation=evaluation, cast_module=True, kernels=k)
        for k in ("cpu", "cuda")
    )
    assert cuda["point"]["activation_bytes"] < cpu["point"]["activation_bytes"]
    assert cuda["point"]["eval_bytes"] > cpu["point"]["eval_bytes"]
    ops = {(a["op"], a["dtype"]) for a in cuda["point"]["largest"]["eval_forward"]}
    assert ("_safe_softmax.default", "float32") in ops
    import torch

    assert torch.nn.functional.dropout.__module__ == "torch.nn.functional"  # restored after the trace


def test_a_padding_free_batch_is_traced_as_on_real_tensors() -> None:
    """TRL's padding-free row (trials.data.flattened): transformers reads its position_ids for packed sequences and
    builds the row's block-diagonal mask, which a fake tensor's values cannot tell it. BFD rows hold several samples
    (the mask, also at micro 1); a single wrapped row holds one sequence (no mask): fake and real equal to the byte,
    and BFD's one row of 4 x 128 tokens above 4 padded rows of 128 (its 512^2 mask against four 128^2 ones)."""
    from trials.trace_trainer import TracedTrainer

    for free, micro in (("bfd", 4), ("bfd", 1), ("rows", 1), ("rows", 2)):
        trainer = TracedTrainer(padding_free=free)  # type: ignore[arg-type]
        fake = trace_point(LLAMA, micro, 128, False, "fp32", fake=True, trainer=trainer)["point"]
        real = trace_point(LLAMA, micro, 128, False, "fp32", fake=False, trainer=trainer)["point"]
        assert fake["peak_bytes"] == real["peak_bytes"], (free, micro)
        assert fake["activation_bytes"] == real["activation_bytes"], (free, micro)
    one_row = trace_point(LLAMA, 1, 128, False, "fp32", trainer=TracedTrainer(padding_free="rows"))["point"]
    two_samples = trace_point(LLAMA, 1, 128, False, "fp32", trainer=TracedTrainer(padding_free="bfd"))["point"]
    assert two_samples["activation_bytes"] > one_row["activation_bytes"]  # the mask a restart makes
    bfd = trace_point(LLAMA, 4, 128, False, "fp32", trainer=TracedTrainer(padding_free="bfd"))["point"]
    padded = trace_point(LLAMA, 4, 128, False, "fp32", padded=True)["point"]
    assert bfd["activation_bytes"] > padded["activation_bytes"]
