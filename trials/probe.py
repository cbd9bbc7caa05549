"""One probe rank: build the model and engine, train on worst-case batches, measure, classify, write the RankResult.

The batches: at a fixed shape (no data), every step pads to knobs.max_length (labels to the job's label length).
With the user's data (ProbeConfig.batches), the memory window runs the worst batch the data makes (each rank its own
worst case: all of them at it), the eval its eval set's worst batch, and the timed window this rank's micro batches
drawn from the data under the collator's padding (one per micro-step, cycled), so the throughput is the data's.

Phases (the same on CPU and CUDA):

0. on CUDA, at rank start: the GPU must be free (``trials.contract.device_busy`` of the device-level use right after
   the rank's context exists, waited on a little: a killed predecessor's memory is released asynchronously), else
   status "device-busy".
1. memory window: at least two full accumulation cycles, so the window holds an optimizer step *after* AdamW's
   state exists (the first real step creates it), then one eval forward / generate when the knobs ask for it. The peak
   is reset after the first optimizer step that really ran: under fp16 a loss-scale overflow skips steps, so the
   window is extended until one real step follows the reset (``MemoryWindow``), else the probe fails. On CPU this
   window runs under the live-tensor tracker (the emulated device: exact peak, OOM at the budget); on CUDA a sampler
   thread reads the device-level use (``torch.cuda.mem_get_info``) and each step's end the use outside the allocator.
2. timed window (at the fixed shape, or on this rank's drawn batches): whole accumulation cycles, untracked (no
   dispatch overhead in the figures): a timestamp (a CUDA event on a GPU) after every micro-step and one
   synchronisation per cycle, so launches are not put in series with the GPU's work (``split_steps``).

The probe engine accumulates over ``min(real accum, 2)`` micro-steps, so it times both plain micro-steps and boundary
(optimizer) steps; the runner composes the real cycle: ``(accum - 1) * micro + boundary``.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import time
from pathlib import Path
from typing import Any, cast

import torch
from transformers import PreTrainedModel

from trials import memory
from trials.contract import (
    EXIT_OK,
    BatchDims,
    Phase,
    ProbeConfig,
    RankResult,
    Status,
    StepStats,
    free_port,
    timed_micro_steps,
)
from trials.contract import probe_accum as contract_accum
from trials.cuda_setup import eager_nccl_init
from trials.data import RankBatches, batch_dims
from trials.dpo import prepare_reference, reference_model
from trials.engine import Engine, build_engine, hidden_size_of_config, host_offload, probe_deepspeed_config
from trials.eval_pile import eval_forward
from trials.fingerprint import fingerprint, versions
from trials.last_words import LastWords
from trials.measure import (
    MemoryWindow,
    StepClock,
    TimedWindow,
    split_steps,
    step_stats,
)
from trials.models import build_dtype, build_model, is_encoder_decoder, load_config, placement
from trials.oom_snapshot import OomSnapshot, snapshot_path
from trials.outcome import classify, launch_fault, one_line
from trials.rank_device import RankDevice
from trials.step_hooks import StepHooks
from trials.trainer_args import deterministic, prepare_model, their_args, their_forward
from trials.trl_head import fuse, ready, step_loss


def probe_accum(config: ProbeConfig) -> int:
    return contract_accum(config.gradient_accumulation_steps)


class Probe:
    def __init__(self, config: ProbeConfig, launch_t: float | None = None) -> None:
        self.config = config
        self.launch_t = launch_t if launch_t is not None else time.time()
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", str(config.world_size)))
        cuda = torch.cuda.is_available()
        self.device = torch.device("cuda", self.local_rank) if cuda else torch.device("cpu")
        self.dev = RankDevice(config, self.device, self.rank)
        ready(config.job.trl_head)  # TRL imported before the device's data limit: its import is no device memory
        self.first_step_t: float | None = None
        self.micro_times: list[float] = []
        self.phases: dict[str, float] = {}
        self._mark_t = time.time()
        self.phases["start"] = max(0.0, self._mark_t - self.launch_t)
        self.boundary_times: list[float] = []
        self.phase: Phase = "setup"
        # with data batches: the shapes built, read back from the tensors (RankResult.memory_shape / timed_shapes)
        self.memory_shape: BatchDims | None = None
        self.timed_shapes: list[BatchDims] = []
        self.window: TimedWindow | None = None
        self.run_phases: dict[str, float] = {}  # where the time after setup went (RankResult.run_phases)
        self.step_hooks = StepHooks()  # what their Trainer does around each micro-step (trials.step_hooks)
        self.args: Any | None = None  # the probe's TrainingArguments (trials.trainer_args), once built

    def _mark(self, phase: str, into: dict[str, float] | None = None) -> None:
        """The seconds since the last mark, as ``phase`` of the setup (or of ``into``: the run after it)."""
        now = time.time()
        (self.phases if into is None else into)[phase] = now - self._mark_t
        self._mark_t = now

    # -- setup ------------------------------------------------------------------------------------------------------
    def _setup_dist(self) -> None:
        needs = self.world_size > 1 or self.config.knobs.engine != "torch"  # DeepSpeed, FSDP2: a process group
        if not needs or torch.distributed.is_initialized():
            return
        os.environ.setdefault("RANK", str(self.rank))
        os.environ.setdefault("LOCAL_RANK", str(self.local_rank))
        os.environ.setdefault("WORLD_SIZE", str(self.world_size))
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in os.environ:
            os.environ["MASTER_PORT"] = str(free_port())
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        timeout = datetime.timedelta(seconds=max(30.0, self.config.timeout_s))
        kwargs: dict[str, Any] = {}
        if eager_nccl_init(self.device.type, self.world_size, torch.__version__):
            kwargs["device_id"] = self.device  # communicators exist (and count) before the window
        torch.distributed.init_process_group(
            backend=backend, rank=self.rank, world_size=self.world_size, timeout=timeout, **kwargs
        )

    def _their_args(self) -> Any | None:
        """The probe's TrainingArguments, from the user's and the knobs (trials.trainer_args; their release's checks
        run here: a refusal is this rank's "refused"), after the process group exists (they read its state);
        deterministic algorithms where their arguments ask for them, as their Trainer sets them."""
        cfg, knobs = self.config, self.config.knobs
        args = their_args(
            cfg.job.trainer_args,
            seq2seq=cfg.job.seq2seq_args,
            micro_batch_size=knobs.micro_batch_size,
            eval_batch_size=knobs.eval_batch_size,
            precision=knobs.precision,
            checkpointing=knobs.gradient_checkpointing,
            cuda=self.device.type == "cuda",
        )
        if deterministic(args):
            from transformers.trainer_utils import enable_full_determinism

            enable_full_determinism(cfg.seed)
        return args

    def _build_model(self, lora: bool = True) -> PreTrainedModel:
        """The model as their Trainer gets it (``lora``: with the job's adapters); a DPO reference is built here too,
        without them (trials.dpo)."""
        cfg = self.config
        where = placement(cfg.knobs, self.device.type)
        zero_config = None
        if where == "zero-init":
            assert cfg.deepspeed is not None
            zero_config = probe_deepspeed_config(
                cfg.deepspeed,
                micro_batch_size=cfg.knobs.micro_batch_size,
                accum=probe_accum(cfg),
                world_size=self.world_size,
                cuda=self.device.type == "cuda",
                hidden_size=hidden_size_of_config(load_config(cfg.model)),
            )
        dtype = build_dtype(cfg.knobs, where)
        model = build_model(cfg.model, where=where, device=self.device, zero_config=zero_config, dtype=dtype)
        if cfg.job.lora is not None and lora:  # the user's adapters, before the engine: its optimizer holds only theirs
            from trials.lora import apply_lora

            return cast(PreTrainedModel, apply_lora(model, cfg.job.lora))  # a PeftModel forwards its API
        return model

    # -- steps ------------------------------------------------------------------------------------------------------
    def _cycle(self, engine: Engine, batch: dict[str, torch.Tensor], accum: int) -> bool:
        """One untimed accumulation cycle of the memory window; True when its optimizer step really ran."""
        if self.first_step_t is None:
            self.first_step_t = time.time()
        skipped = engine.skipped_steps()
        for _ in range(accum):
            self.step_hooks.before(batch)
            self.step_hooks.after(engine.micro_step(batch))
            self._host_offload(engine)
            self.dev.quiet_sample()
        return engine.skipped_steps() == skipped

    def _timed(self, engine: Engine, batches: list[dict[str, torch.Tensor]], steps: int, accum: int) -> None:
        """Whole accumulation cycles, a timestamp after each micro-step, one synchronisation per cycle; micro-step k
        runs ``batches[k % len(batches)]``. ``steps`` micro-steps at least; at a fixed shape more, up to
        max_measure_steps, until the cycles agree within timing_tolerance (``TimedWindow``); drawn batches run once
        (each cycle its own shapes: they differ by design)."""
        window = self._timed_window(steps // accum, accum)
        clock = StepClock(self.device)
        k = 0
        done = False
        while not done:
            clock.mark()
            boundaries = []
            for _ in range(accum):
                batch = batches[k % len(batches)]
                self.step_hooks.before(batch)
                boundaries.append(engine.micro_step(batch))
                self.step_hooks.after(boundaries[-1])
                k += 1
                clock.mark()
            durations = clock.durations()
            micro, boundary = split_steps(durations, boundaries)
            self.micro_times += micro
            self.boundary_times += boundary
            cycle_s = sum(durations)
            done = window.record(cycle_s) or (window.past_minimum and not self._may_extend(cycle_s))
            done = self._all_done(done)
        self.window = window

    def _timed_window(self, cycles: int, accum: int) -> TimedWindow:
        cfg = self.config
        if cfg.batches is not None:
            return TimedWindow(cycles, cycles, math.inf)
        most = timed_micro_steps(cfg.max_measure_steps or 2 * cfg.measure_steps, cfg.gradient_accumulation_steps)
        return TimedWindow(cycles, max(cycles, most // accum), cfg.timing_tolerance)

    def _may_extend(self, cycle_s: float) -> bool:
        """Whether one more timed cycle past the minimum keeps the probe well inside its timeout (half of it: the
        search sized the timeout on probes of the minimum length)."""
        return time.time() - self.launch_t + 2 * cycle_s < 0.5 * self.config.timeout_s

    def _all_done(self, done: bool) -> bool:
        """Every rank stops the timed window on the same cycle (their steps meet in collectives): done when all are."""
        if self.world_size == 1 or not torch.distributed.is_initialized():
            return done
        more = torch.tensor([0 if done else 1], device=self.device)
        torch.distributed.all_reduce(more, op=torch.distributed.ReduceOp.MAX)
        return int(more.item()) == 0

    def _host_offload(self, engine: Engine) -> None:
        """Offloaded optimizer state lives in host memory: take it off the emulated device, pause its step."""
        host_offload(engine, self.dev.tracker)

    def _settle(self) -> None:
        """After the first real optimizer step every lazily built buffer exists (AdamW state, ZeRO's offload buffers
        now taken off the device): the peak is taken from here on, over steady-state cycles with state resident."""
        self.dev.peaks.reset()

    def _eval(self, engine: Engine, batches: RankBatches) -> None:
        knobs = self.config.knobs
        if knobs.eval_batch_size is None and not knobs.generate:
            return
        job = self.config.job
        batch = batches.eval(knobs.eval_batch_size or knobs.micro_batch_size)
        model = engine.module
        model.eval()
        try:
            with torch.no_grad(), engine.autocast():
                self.phase = "eval"
                if job.dpo is not None:  # DPO's prediction_step: its compute_loss over the eval pairs
                    engine.loss(model, batch)
                else:  # the logits their eval loop keeps, kept; their compute_loss (label smoothing)
                    eval_forward(
                        model, batch, job.eval_held_batches, their_forward(self.args, not is_encoder_decoder(model))
                    )
                self.dev.peaks.end("eval_forward")
                self._mark("eval_forward", self.run_phases)
                if knobs.generate:
                    self.phase = "generate"
                    synced = knobs.sharded and self.world_size > 1  # the Trainer's synced_gpus (ZeRO-3, FSDP)
                    model.generate(  # type: ignore[operator]  # engine.module is typed as a plain Module
                        input_ids=batch["input_ids"],
                        attention_mask=batch["attention_mask"],
                        max_new_tokens=job.generation_length(knobs.max_length),
                        min_new_tokens=job.generation_length(knobs.max_length),
                        do_sample=False,
                        num_beams=job.num_beams,
                        use_cache=True,
                        synced_gpus=synced,
                    )
                    self.dev.peaks.end("generate")
                    self._mark("generate", self.run_phases)
        finally:
            model.train()
        self.dev.quiet_sample()

    # -- the run ----------------------------------------------------------------------------------------------------
    def run(self) -> RankResult:
        cfg = self.config
        knobs = cfg.knobs
        self.dev.setup()
        if knobs.engine == "deepspeed":
            import deepspeed  # noqa: F401  (imported before the tracker: its import is not device memory)
        self._mark("import")
        self._setup_dist()
        self._mark("dist")
        args = self.args = self._their_args()
        torch.manual_seed(cfg.seed)
        model = self._build_model()
        prepare_model(model, args)  # use_cache, Liger, NEFTune: what their Trainer does before its engine
        reference = reference_model(cfg, is_encoder_decoder(model), lambda: self._build_model(lora=False))
        fuse(cfg.job.trl_head, model, reference)  # TRL's fused LM head, as SFTTrainer / DPOTrainer patch it
        self._mark("model")
        vocab = int(model.config.vocab_size)
        encdec = is_encoder_decoder(model)
        accum = probe_accum(cfg)
        batches = RankBatches(cfg, self.rank, self.device, vocab, encdec)
        if self.dev.tracker is not None:
            self.dev.tracker.track(memory.module_tensors(model))
            if reference is not None:
                self.dev.tracker.track(memory.module_tensors(reference))
        with self.dev.tracking():
            batch = batches.memory()
            if cfg.batches is not None:
                self.memory_shape = batch_dims(batch, encdec, cfg.knobs.micro_batch_size)
            engine = build_engine(model, cfg, accum, self.device, self.world_size, args)
            reference = prepare_reference(reference, engine, self.device)  # DPO's (trials.dpo), or None
            engine.loss = step_loss(cfg.job.trl_head, cfg.job.dpo, reference, engine.loss, args)  # trials.trl_head
            self.step_hooks = StepHooks.of(args, self.device, self.world_size)
            self._host_offload(engine)
            self._mark("engine")
            self.phases.update({f"engine.{part}": value for part, value in engine.parts.items()})
            window = MemoryWindow(min_cycles=math.ceil(max(cfg.warmup_steps, 2 * accum) / accum))
            self.phase = "train"
            with self.dev.sampling() as sampler:
                action = "more"
                while action != "done":
                    action = window.record(self._cycle(engine, batch, accum))
                    if action == "settle":
                        self._settle()
                self.dev.peaks.end("train")
                self._mark("memory_window", self.run_phases)
                self._eval(engine, batches)
            self.dev.sampled(sampler)
        steps = timed_micro_steps(cfg.measure_steps, cfg.gradient_accumulation_steps)
        timed, self.timed_shapes = batches.timed(batch, steps)
        self.phase = "train"
        self._mark("timed_build", self.run_phases)
        self._timed(engine, timed, steps, accum)
        self._mark("timed", self.run_phases)
        return RankResult(
            rank=self.rank,
            status=Status.OK,
            memory=self.dev.report(self.phase),
            steps=self._stats(),
            setup_s=self._setup_s(),
            versions=versions(),
            fingerprint=fingerprint(self.device),
            setup_phases=self.phases,
            run_phases=self.run_phases,
            memory_shape=self.memory_shape,
            timed_shapes=self.timed_shapes,
            sharded=getattr(engine, "sharded", None),
        )

    def _setup_s(self) -> float | None:
        return None if self.first_step_t is None else max(0.0, self.first_step_t - self.launch_t)

    def _stats(self) -> StepStats:
        return step_stats(self.micro_times, self.boundary_times, self.config.gradient_accumulation_steps, self.window)

    def outcome(self, exc: BaseException) -> tuple[Status, int]:
        """The status and exit code of a failure of this rank (trials.outcome.classify, knowing its device)."""
        return classify(exc, cuda=self.device.type == "cuda", device_full=self.dev.full())

    def failure(self, exc: BaseException) -> tuple[RankResult, int]:
        status, code = self.outcome(exc)
        mem = None
        with contextlib.suppress(Exception):
            mem = self.dev.report(self.phase)
        return RankResult(
            rank=self.rank,
            status=status,
            cause=one_line(exc),
            memory=mem,
            setup_s=self._setup_s(),
            versions=versions(),
            fingerprint=fingerprint(self.device),
            setup_phases=self.phases,
            run_phases=self.run_phases,
            phase=self.phase,
            launch_fault=launch_fault(exc),
        ), code


def run_probe_rank(config: ProbeConfig, out: Path, launch_t: float | None = None) -> int:
    """Runs this rank's probe, writes its RankResult, returns the exit code (EXIT_OK / EXIT_OOM / EXIT_ERROR ...).

    What the rank cannot put in its result file (an exception past its handler, a result it cannot write, a side
    thread's failure) it leaves as a RankReason beside it (trials.last_words); the exit code carries the class too."""
    with LastWords.of_rank(config, out) as words:  # installed already by ``python -m trials``, before its imports
        probe = Probe(config, launch_t)
        if probe.device.type == "cuda":
            probe.dev.snapshot = OomSnapshot(probe.device, snapshot_path(out), config.device_memory)
        words.attach(lambda: probe.phase, probe.outcome)
        try:
            result, code = probe.run(), EXIT_OK
        except Exception as exc:
            result, code = probe.failure(exc)
        return words.deliver(result, code)
    return words.exit_code
