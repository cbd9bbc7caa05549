"""Which precision mode the memory trace runs for a config: the mode the config's engine trains and evaluates in.

- the plain torch engine (the Trainer without DeepSpeed): fp32 weights, grads and AdamW state, bf16/fp16 through
  ``torch.autocast`` (which keeps a low-precision copy of each matmul weight for the region; the residual stream and
  the elementwise ops between the matmuls stay fp32); the Trainer evaluates under the same autocast;
- DeepSpeed bf16/fp16: the module itself is cast to half precision (``engine._configure_distributed_model``:
  ``module.bfloat16()`` / ``module.half()``), so every activation between the matmuls is half too, no autocast;
  the fp32 master weights and Adam state live in the ZeRO (or BF16/FP16) optimizer, fp16 adds a loss scaler; eval
  and generate run the same half-precision module (the Trainer evaluates ``model_wrapped.module``);
- FSDP2 (accelerate's preparation): the policy's mode, traced by running it (trials.trace_fsdp): fp32 parameter
  shards (accelerate upcasts trainable params before ``fully_shard``), each block gathered and computed in the param
  dtype (bf16), grads reduced as the policy says, no autocast; eval and generate on the same sharded module;
- fp32: one mode for every engine.

Pure: no torch import. The trace (trials/estimate.py) takes ``cast_module``; the estimator reads the points traced
in the config's mode (:func:`tuner.memory.traced.traced`)."""

from __future__ import annotations

from dataclasses import dataclass

from trials.contract import Knobs

HALF = ("bf16", "fp16")


@dataclass(frozen=True)
class TracedPrecision:
    """The precision mode of one config's trace: the job's ``precision`` and whether the module itself is cast to it
    (DeepSpeed) or runs fp32 weights under autocast (the plain torch engine)."""

    precision: str
    engine: str
    cast_module: bool

    def line(self) -> str:
        """One line: which mode was traced, and why (the engine and the job's precision)."""
        if self.precision not in HALF:
            return f"precision traced: fp32 (the job trains in fp32; engine {self.engine})"
        p = self.precision
        if self.engine == "fsdp2":
            return (
                f"precision traced: {p}, FSDP2's mixed precision policy (the job trains in {p} on FSDP2: fp32 "
                f"parameter shards, each block gathered and computed in {p}, as accelerate's preparation sets it; "
                "eval and generate on the same sharded module)"
            )
        if self.cast_module:
            scaler = "; a loss scaler" if p == "fp16" else ""
            return (
                f"precision traced: {p}, the module cast to {p} (the job trains in {p} on DeepSpeed, whose {p} engine "
                f"casts the model itself; fp32 master weights and Adam state in its optimizer{scaler}; eval and "
                f"generate on the {p} module)"
            )
        scaler = " with a grad scaler" if p == "fp16" else ""
        return (
            f"precision traced: {p} autocast over fp32 weights (the job trains in {p} on the plain torch engine, as "
            f"the Trainer runs it without DeepSpeed{scaler}; eval and generate under the same autocast)"
        )


def casts_module(engine: str, precision: str) -> bool:
    """Whether ``engine`` runs ``precision`` with the module itself cast to it: DeepSpeed bf16/fp16 (the plain torch
    engine runs fp32 weights under autocast; fp32 is one mode for both)."""
    return engine == "deepspeed" and precision in HALF


def traced_precision(knobs: Knobs) -> TracedPrecision:
    """The mode the config's engine runs (:func:`casts_module`)."""
    cast = casts_module(knobs.engine, knobs.precision)
    return TracedPrecision(precision=knobs.precision, engine=knobs.engine, cast_module=cast)
