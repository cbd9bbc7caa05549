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
    RankMemory,
    RankResult,
    Status,
    StepStats,
    free_port,
    timed_micro_steps,
)
from trials.contract import probe_accum as contract_accum
from trials.cuda_setup import eager_nccl_init, take_device
from trials.data import batch_dims, worst_case_batch
from trials.engine import Engine, build_engine, hidden_size_of_config, probe_deepspeed_config
from trials.fingerprint import fingerprint, versions
from trials.last_words import LastWords
from trials.measure import (
    DeviceSampler,
    MemoryWindow,
    PhasePeaks,
    StepClock,
    device_used,
    split_steps,
    step_stats,
)
from trials.models import build_dtype, build_model, is_encoder_decoder, load_config, placement
from trials.oom_snapshot import OomSnapshot, snapshot_path
from trials.outcome import classify, launch_fault, one_line


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
        self.tracker: memory.LiveTensorTracker | None = None
        self.capacity: int | None = None
        self.baseline_rss = 0
        self.first_step_t: float | None = None
        self.micro_times: list[float] = []
        self.phases: dict[str, float] = {}
        self._mark_t = time.time()
        self.phases["start"] = max(0.0, self._mark_t - self.launch_t)
        self.boundary_times: list[float] = []
        self.phase: Phase = "setup"
        # CUDA device-level use (bytes): at rank start, the most seen in the memory window, and the most seen outside
        # the caching allocator at a step's end
        self.used_start: int | None = None
        self.used_peak: int | None = None
        self.overhead = 0
        self.peaks = PhasePeaks.of(lambda: self.tracker, self.device)  # per phase of the memory window
        self.snapshot: OomSnapshot | None = None  # CUDA: the memory snapshot an OOM in the window writes
        # with data batches: the shapes built, read back from the tensors (RankResult.memory_shape / timed_shapes)
        self.memory_shape: BatchDims | None = None
        self.timed_shapes: list[BatchDims] = []

    def _mark(self, phase: str) -> None:
        now = time.time()
        self.phases[phase] = now - self._mark_t
        self._mark_t = now

    # -- setup ------------------------------------------------------------------------------------------------------
    def _setup_memory(self) -> None:
        budget = self.config.device_memory
        self.baseline_rss = memory.current_rss()
        if self.device.type == "cuda":
            self.used_start = take_device(self.device, self.config.busy_bytes)
            total = torch.cuda.get_device_properties(self.device).total_memory
            if budget:
                torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total), self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.capacity = min(budget, total) if budget else total
        else:
            self.tracker = memory.LiveTensorTracker(capacity=budget)
            if budget:
                memory.set_data_limit(budget)
            self.capacity = budget

    def _setup_dist(self) -> None:
        needs = self.world_size > 1 or self.config.knobs.engine == "deepspeed"
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

    def _build_model(self) -> PreTrainedModel:
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
        if cfg.job.lora is not None:  # the user's adapters, before the engine: its optimizer holds only theirs
            from trials.lora import apply_lora

            return cast(PreTrainedModel, apply_lora(model, cfg.job.lora))  # a PeftModel forwards its API
        return model

    def _tracking(self) -> contextlib.AbstractContextManager[Any]:
        if self.tracker is not None:
            return self.tracker
        return self.snapshot if self.snapshot is not None else contextlib.nullcontext()

    def _sampling(self) -> contextlib.AbstractContextManager[Any]:
        return DeviceSampler(self.device) if self.device.type == "cuda" else contextlib.nullcontext()

    # -- steps ------------------------------------------------------------------------------------------------------
    def _quiet_sample(self) -> None:
        """At a step's end (no allocation in flight): the device-level use, and what of it is outside the allocator."""
        if self.device.type != "cuda":
            return
        torch.cuda.synchronize(self.device)
        used = device_used(self.device)
        self.used_peak = max(self.used_peak or 0, used)
        self.overhead = max(self.overhead, used - torch.cuda.memory_reserved(self.device))

    def _cycle(self, engine: Engine, batch: dict[str, torch.Tensor], accum: int) -> bool:
        """One untimed accumulation cycle of the memory window; True when its optimizer step really ran."""
        if self.first_step_t is None:
            self.first_step_t = time.time()
        skipped = engine.skipped_steps()
        for _ in range(accum):
            engine.micro_step(batch)
            self._host_offload(engine)
            self._quiet_sample()
        return engine.skipped_steps() == skipped

    def _timed(self, engine: Engine, batches: list[dict[str, torch.Tensor]], cycles: int, accum: int) -> None:
        """Whole accumulation cycles, a timestamp after each micro-step, one synchronisation per cycle; micro-step k
        runs ``batches[k % len(batches)]``."""
        clock = StepClock(self.device)
        k = 0
        for _ in range(cycles):
            clock.mark()
            boundaries = []
            for _ in range(accum):
                boundaries.append(engine.micro_step(batches[k % len(batches)]))
                k += 1
                clock.mark()
            micro, boundary = split_steps(clock.durations(), boundaries)
            self.micro_times += micro
            self.boundary_times += boundary

    def _host_offload(self, engine: Engine) -> None:
        """Offloaded optimizer state lives in host memory: take it off the emulated device, pause its step."""
        host = engine.host_optimizer()
        if host is None or self.tracker is None:
            return
        self.tracker.mark_host(memory.optimizer_tensors(host))
        self.tracker.mark_host(engine.host_tensors())
        if not getattr(host, "_tuner_paused", False):
            step = host.step
            tracker = self.tracker

            def paused_step(*args: Any, **kwargs: Any) -> Any:
                with tracker.paused():
                    return step(*args, **kwargs)

            host.step = paused_step
            host._tuner_paused = True

    def _settle(self) -> None:
        """After the first real optimizer step every lazily built buffer exists (AdamW state, ZeRO's offload buffers
        now taken off the device): the peak is taken from here on, over steady-state cycles with state resident."""
        self.peaks.reset()

    def _eval(self, engine: Engine, vocab: int, encdec: bool) -> None:
        knobs = self.config.knobs
        if knobs.eval_batch_size is None and not knobs.generate:
            return
        size = knobs.eval_batch_size or knobs.micro_batch_size
        job = self.config.job
        data = self.config.batches
        at = data.eval_worst or data.worst if data is not None else None
        batch = worst_case_batch(
            size,
            at.input_length if at is not None else knobs.max_length,
            vocab,
            seed=self.config.seed + 1,
            encoder_decoder=encdec,
            device=self.device,
            label_length=self._label_length(at),
            padded=at is not None and at.padded,
        )
        model = engine.module
        model.eval()
        try:
            with torch.no_grad(), engine.autocast():
                self.phase = "eval"
                model(**batch)
                self.peaks.end("eval_forward")
                if knobs.generate:
                    self.phase = "generate"
                    zero3 = knobs.engine == "deepspeed" and knobs.zero_stage == 3 and self.world_size > 1
                    model.generate(  # type: ignore[operator]  # engine.module is typed as a plain Module
                        input_ids=batch["input_ids"],
                        attention_mask=batch["attention_mask"],
                        max_new_tokens=job.generation_length(knobs.max_length),
                        min_new_tokens=job.generation_length(knobs.max_length),
                        do_sample=False,
                        num_beams=job.num_beams,
                        use_cache=True,
                        synced_gpus=zero3,
                    )
                    self.peaks.end("generate")
        finally:
            model.train()
        self._quiet_sample()

    def _label_length(self, at: BatchDims | None) -> int:
        """The labels of a batch at ``at`` (None: the fixed shape's, the job's label length)."""
        cfg = self.config
        if at is None:
            return cfg.job.label_length(cfg.knobs.max_length)
        return at.target_length or at.input_length

    def _batch(self, at: BatchDims | None, seed: int, vocab: int, encdec: bool) -> dict[str, torch.Tensor]:
        """A micro batch of random ids at ``at`` (None: the fixed shape, knobs.max_length)."""
        knobs = self.config.knobs
        return worst_case_batch(
            knobs.micro_batch_size,
            at.input_length if at is not None else knobs.max_length,
            vocab,
            seed=seed,
            encoder_decoder=encdec,
            device=self.device,
            label_length=self._label_length(at),
            padded=at is not None and at.padded,
        )

    def _timed_batches(
        self, fixed: dict[str, torch.Tensor], vocab: int, encdec: bool, steps: int
    ) -> list[dict[str, torch.Tensor]]:
        """The timed window's batches: the memory window's at a fixed shape, else this rank's drawn shapes (one
        batch per distinct shape, built before the clock starts)."""
        data = self.config.batches
        if data is None:
            return [fixed]
        shapes = data.timed_for(self.rank)
        built: dict[BatchDims, dict[str, torch.Tensor]] = {}
        out = []
        for k in range(steps):
            at = shapes[k % len(shapes)]
            key = at.model_copy(update={"real_tokens": None})
            if key not in built:
                built[key] = self._batch(at, self.config.seed + self.rank + 2 + len(built), vocab, encdec)
            out.append(built[key])
        self.timed_shapes = [batch_dims(b, encdec) for b in out]
        return out

    # -- the run ----------------------------------------------------------------------------------------------------
    def run(self) -> RankResult:
        cfg = self.config
        knobs = cfg.knobs
        self._setup_memory()
        if knobs.engine == "deepspeed":
            import deepspeed  # noqa: F401  (imported before the tracker: its import is not device memory)
        self._mark("import")
        self._setup_dist()
        self._mark("dist")
        torch.manual_seed(cfg.seed)
        model = self._build_model()
        self._mark("model")
        vocab = int(model.config.vocab_size)
        encdec = is_encoder_decoder(model)
        accum = probe_accum(cfg)
        if self.tracker is not None:
            self.tracker.track(memory.module_tensors(model))
        with self._tracking():
            worst = cfg.batches.worst if cfg.batches is not None else None
            batch = self._batch(worst, cfg.seed + self.rank, vocab, encdec)
            if cfg.batches is not None:
                self.memory_shape = batch_dims(batch, encdec)
            engine = build_engine(model, cfg, accum, self.device, self.world_size)
            self._host_offload(engine)
            self._mark("engine")
            window = MemoryWindow(min_cycles=math.ceil(max(cfg.warmup_steps, 2 * accum) / accum))
            self.phase = "train"
            with self._sampling() as sampler:
                action = "more"
                while action != "done":
                    action = window.record(self._cycle(engine, batch, accum))
                    if action == "settle":
                        self._settle()
                self.peaks.end("train")
                self._eval(engine, vocab, encdec)
            if sampler is not None:
                self.used_peak = max(self.used_peak or 0, sampler.peak)
        steps = timed_micro_steps(cfg.measure_steps, cfg.gradient_accumulation_steps)
        timed = self._timed_batches(batch, vocab, encdec, steps)
        self.phase = "train"
        self._timed(engine, timed, steps // accum, accum)
        return RankResult(
            rank=self.rank,
            status=Status.OK,
            memory=self._memory(),
            steps=self._stats(),
            setup_s=self._setup_s(),
            versions=versions(),
            fingerprint=fingerprint(self.device),
            setup_phases=self.phases,
            memory_shape=self.memory_shape,
            timed_shapes=self.timed_shapes,
        )

    def _setup_s(self) -> float | None:
        return None if self.first_step_t is None else max(0.0, self.first_step_t - self.launch_t)

    def _memory(self) -> RankMemory:
        rss = max(0, memory.peak_rss() - self.baseline_rss)
        allocated, reserved = self.peaks.overall()
        if self.device.type == "cuda":
            stats = torch.cuda.memory_stats(self.device)
            return RankMemory(
                rank=self.rank,
                peak_allocated=allocated,
                peak_reserved=reserved,
                phases=dict(self.peaks.peaks),
                peak_rss=rss,
                capacity=self.capacity,
                alloc_retries=int(stats.get("num_alloc_retries", 0)),
                overhead=self.overhead,
                device_used_peak=self.used_peak,
                device_used_start=self.used_start,
                **self._failed(),
            )
        return RankMemory(
            rank=self.rank,
            peak_allocated=allocated,
            peak_reserved=allocated,
            phases=dict(self.peaks.peaks),
            capacity=self.capacity,
            peak_rss=rss,
            oom_need=self.tracker.oom_need if self.tracker is not None else None,
            **self._failed(),
        )

    def _failed(self) -> dict[str, Any]:
        """After an OOM: the refused allocation (with the phase the rank was in) and, on CUDA, the snapshot's path."""
        refused = self.tracker.refused if self.tracker is not None else None
        snap = self.snapshot
        if refused is None and snap is not None:
            refused = snap.failed
        out: dict[str, Any] = {}
        if refused is not None:
            out["failed_allocation"] = refused.model_copy(update={"phase": self.phase, "capacity": self.capacity})
        if snap is not None and snap.written is not None:
            out["snapshot"] = str(snap.written)
        return out

    def _stats(self) -> StepStats:
        return step_stats(self.micro_times, self.boundary_times, self.config.gradient_accumulation_steps)

    def _device_full(self) -> bool:
        """At a failure on CUDA: the rank held ``memory.DEVICE_FULL`` of its capacity (an allocation just failed)."""
        if self.device.type != "cuda" or not self.capacity:
            return False
        with contextlib.suppress(RuntimeError):
            held = torch.cuda.memory_reserved(self.device) + self.overhead
            return held >= memory.DEVICE_FULL * self.capacity
        return False

    def outcome(self, exc: BaseException) -> tuple[Status, int]:
        """The status and exit code of a failure of this rank (trials.outcome.classify, knowing its device)."""
        return classify(exc, cuda=self.device.type == "cuda", device_full=self._device_full())

    def failure(self, exc: BaseException) -> tuple[RankResult, int]:
        status, code = self.outcome(exc)
        mem = None
        with contextlib.suppress(Exception):
            mem = self._memory()
        return RankResult(
            rank=self.rank,
            status=status,
            cause=one_line(exc),
            memory=mem,
            setup_s=self._setup_s(),
            versions=versions(),
            fingerprint=fingerprint(self.device),
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
            probe.snapshot = OomSnapshot(probe.device, snapshot_path(out), config.device_memory)
        words.attach(lambda: probe.phase, probe.outcome)
        try:
            result, code = probe.run(), EXIT_OK
        except Exception as exc:
            result, code = probe.failure(exc)
        return words.deliver(result, code)
    return words.exit_code
