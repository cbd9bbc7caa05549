"""The pieces of their Trainer a probe borrows (trials.trainer_args, trials.step_hooks, trials.eval_pile), each shown
doing what their Trainer does with the field, in process on a tiny Llama: the optimizer their resolver builds, their
checks refusing what their Trainer refuses, label smoothing, NEFTune, use_cache, checkpointing keywords, DDP keywords,
the cache emptied, tokens all-reduced, the eval pile, deterministic algorithms."""

from __future__ import annotations

import datetime
import os
from typing import Any

import pytest
import torch

from trials.contract import Knobs, ModelSpec, ProbeConfig
from trials.eval_pile import eval_forward
from trials.memory import LiveTensorTracker
from trials.models import build_model
from trials.outcome import ConfigRefused
from trials.step_hooks import StepHooks
from trials.trainer_args import (
    ArgsRefused,
    build_optimizer,
    checkpointing_kwargs,
    ddp_kwargs,
    loss_function,
    prepare_model,
    their_args,
)

LLAMA = ModelSpec(source="builtin:tiny-llama")


def args(**given: Any) -> Any:
    return their_args(
        given,
        seq2seq=False,
        micro_batch_size=2,
        eval_batch_size=None,
        precision="fp32",
        checkpointing=False,
        cuda=False,
    )


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(LLAMA, where="device", device=torch.device("cpu"))


def batch(rows: int = 2, length: int = 16) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 100, (rows, length))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def state_bytes(opt: torch.optim.Optimizer) -> int:
    return sum(v.untyped_storage().nbytes() for s in opt.state.values() for v in s.values() if torch.is_tensor(v))


def stepped(opt: torch.optim.Optimizer, m: torch.nn.Module) -> torch.optim.Optimizer:
    m(**batch()).loss.backward()
    opt.step()
    return opt


def test_the_optimizer_is_their_resolvers_with_their_values() -> None:
    m = model()
    adamw = stepped(build_optimizer(m, args(weight_decay=0.01, adam_beta1=0.8), 1e-4, cuda=False), m)
    adafactor = stepped(build_optimizer(m, args(optim="adafactor"), 1e-4, cuda=False), m)
    sgd = stepped(build_optimizer(m, args(optim="sgd"), 1e-4, cuda=False), m)
    assert type(adamw).__name__ == "AdamW" and type(adafactor).__name__ == "Adafactor" and type(sgd).__name__ == "SGD"
    # their decay groups: biases and norms without decay, the rest at their weight_decay; their betas
    decays = sorted(g["weight_decay"] for g in adamw.param_groups)
    assert decays == [0.0, 0.01] and all(g["betas"][0] == 0.8 for g in adamw.param_groups)
    # the states differ as the optimizers do: AdamW's m and v, Adafactor's factored moments, plain SGD none
    params = sum(p.numel() for p in m.parameters())
    assert state_bytes(adamw) >= 8 * params > 20 * state_bytes(adafactor) and state_bytes(sgd) == 0


def test_an_optimizer_this_host_cannot_build_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigRefused, match=r"adamw_8bit: .*bitsandbytes") as err:
        build_optimizer(model(), args(optim="adamw_8bit"), 1e-4, cuda=False)
    assert "\n" not in str(err.value)


def test_their_training_arguments_refuse_what_their_trainer_refuses() -> None:
    with pytest.raises(ArgsRefused, match="load_best_model_at_end requires the save and eval strategy to match"):
        args(eval_strategy="steps", save_strategy="epoch", load_best_model_at_end=True)
    with pytest.raises(ArgsRefused, match="unexpected keyword argument 'evaluation_strategy'"):
        args(evaluation_strategy="steps")


def test_label_smoothing_is_their_label_smoother_and_holds_more() -> None:
    m, b = model(), batch(4, 32)
    plain, smoothed = loss_function(args(), causal=True), loss_function(args(label_smoothing_factor=0.1), causal=True)
    peaks = []
    for loss_of in (plain, smoothed):
        tracker = LiveTensorTracker()
        with tracker:
            loss = loss_of(m, b)
            loss.backward()
        peaks.append(tracker.peak)
        m.zero_grad(set_to_none=True)
    from transformers.trainer_pt_utils import LabelSmoother

    with torch.no_grad():
        want = LabelSmoother(0.1)(m(**{k: v for k, v in b.items() if k != "labels"}), b["labels"], shift_labels=True)
        assert torch.allclose(smoothed(m, b), want)
    assert peaks[1] > peaks[0]  # the smoother's log-softmax over the whole vocabulary, beside the model's own


def test_neftune_noise_and_use_cache_are_set_as_their_trainer_sets_them() -> None:
    m = model()
    embed = m.get_input_embeddings()
    ids = torch.randint(0, 100, (1, 8))
    quiet = embed(ids)
    undo = prepare_model(m, args(neftune_noise_alpha=5.0, use_cache=True))
    m.train()
    noisy = embed(ids)
    assert not torch.allclose(quiet, noisy) and m.config.use_cache is True
    undo()
    assert torch.allclose(embed(ids), quiet)
    prepare_model(m, args())
    assert m.config.use_cache is False  # transformers 5's default: no cache in training


def test_checkpointing_keywords_reach_the_models_checkpoint() -> None:
    m = model()
    kwargs = checkpointing_kwargs(args(gradient_checkpointing_kwargs={"use_reentrant": True}))
    assert kwargs == {"use_reentrant": True}
    from trials.engine import enable_checkpointing

    enable_checkpointing(m, kwargs)
    layer = m.model.layers[0]
    assert layer.gradient_checkpointing and layer._gradient_checkpointing_func.keywords["use_reentrant"] is True


@pytest.fixture
def one_rank_group() -> Any:
    from trials.contract import free_port

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    torch.distributed.init_process_group("gloo", rank=0, world_size=1, timeout=datetime.timedelta(seconds=30))
    yield
    torch.distributed.destroy_process_group()


def test_ddp_keywords_are_theirs(one_rank_group: Any) -> None:
    knobs = Knobs(micro_batch_size=2, max_length=16, engine="torch")
    given = args(ddp_bucket_cap_mb=1, ddp_find_unused_parameters=True, ddp_broadcast_buffers=False)
    ddp = torch.nn.parallel.DistributedDataParallel(model(), **ddp_kwargs(knobs, torch.device("cpu"), given))
    assert ddp.bucket_bytes_cap == 1 << 20 and ddp.find_unused_parameters is True and ddp.broadcast_buffers is False


def test_step_hooks_empty_the_cache_and_reduce_token_counts(one_rank_group: Any, monkeypatch: Any) -> None:
    import accelerate.utils.memory as acc_memory

    emptied: list[int] = []
    monkeypatch.setattr(acc_memory, "clear_device_cache", lambda *a, **k: emptied.append(1))
    hooks = StepHooks.of(args(torch_empty_cache_steps=2), torch.device("cpu"), world_size=1)
    for boundary in (False, True, False, True, False, True):  # optimizer steps 0, 1, 2 of two micro-steps each
        hooks.after(boundary)
    assert len(emptied) == hooks.emptied == 4  # the micro-steps of optimizer steps 0 and 2
    reduce = StepHooks(average_tokens=True, device=torch.device("cpu"))
    reduce.before(batch())
    assert reduce.reduced == 1


def test_the_eval_pile_holds_the_logits_their_loop_concatenates() -> None:
    m, b = model(), batch(4, 32)
    m.eval()
    peaks = {}
    for held in (0, 1, 3):
        tracker = LiveTensorTracker()
        with tracker, torch.no_grad():
            eval_forward(m, b, held)
        peaks[held] = tracker.peak
    logits = 4 * 32 * m.config.vocab_size * 4
    assert peaks[0] == peaks[1]  # one batch's logits exist in its forward anyway
    assert peaks[3] - peaks[1] >= 2 * logits  # two more batches' logits held (and their concatenation)


def test_full_determinism_is_set_in_the_probe() -> None:
    from trials.probe import Probe

    config = ProbeConfig(knobs=Knobs(micro_batch_size=2, max_length=16, engine="torch"), model=LLAMA)
    config = config.model_copy(
        update={"job": config.job.model_copy(update={"trainer_args": {"full_determinism": True}})}
    )
    try:
        Probe(config)._their_args()
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)
