"""Every field of TrainingArguments and Seq2SeqTrainingArguments of the supported transformers releases (4.57.3,
5.17.0, 5.25.0: the union; tuner/job/ledger/fields/ holds each release's own list) and what a probe does with it.

"run" fields reach the probe's own TrainingArguments (trials.trainer_args), built from the user's by their release's
class, so its checks and its fills are theirs; the probe then borrows the Trainer's code for each (its optimizer
resolver, LabelSmoother, NEFTune's hook, its length-grouped sampler ...). Read from the 5.25 / 5.17 / 4.57 sources.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tuner.job.ledger import Entry, falsy, neutral, refused, run, unless

_LOG = "logging"
_HUB = "the Hub"
_SAVE = "saving (between steps, not in the step)"
_DATA_HOST = "the host's data loading (the probe's batches are built in advance)"
_SCHEDULE = "the learning-rate schedule (values, not memory or speed)"
_LAUNCHER = "set by the launcher"
_METRICS = "what evaluation computes on the host"


def _not_apex(value: Any) -> bool:
    return str(value or "auto").lower() not in ("apex",)


def _split_batches(value: Any) -> str | None:
    if isinstance(value, Mapping) and value.get("split_batches"):
        return "split_batches divides each batch over the processes: the per-device batch is not the file's"
    return None


TRAINING_ARGS: dict[str, Entry] = {
    # the batch and its accumulation: the searched knob and what the global batch derives
    "per_device_train_batch_size": run("the micro batch (searched; the global batch held)"),
    "gradient_accumulation_steps": run("derived: global batch / (micro batch x world size)"),
    "per_device_eval_batch_size": run("the eval batch (held)"),
    "auto_find_batch_size": neutral(
        "their Trainer halves the batch only after an OOM, which the pick avoids; it stays on as their fallback"
    ),
    # the optimizer, as Trainer.create_optimizer builds it (get_optimizer_cls_and_kwargs)
    "optim": run("the optimizer, built by their Trainer's resolver"),
    "optim_args": run("the optimizer's extra arguments (their resolver reads them)"),
    "optim_target_modules": run("which modules GaLore / APOLLO-style optimizers wrap (their resolver)"),
    "adafactor": run("transformers 4.x's switch to Adafactor (their TrainingArguments sets optim)"),
    "learning_rate": run("the optimizer's learning rate"),
    "weight_decay": run("the optimizer's decay groups"),
    "adam_beta1": run("the optimizer's betas"),
    "adam_beta2": run("the optimizer's betas"),
    "adam_epsilon": run("the optimizer's eps"),
    "max_grad_norm": run("gradient clipping (the torch engine; DeepSpeed's gradient_clipping fill)"),
    "lr_scheduler_type": neutral(_SCHEDULE),
    "lr_scheduler_kwargs": neutral(_SCHEDULE),
    "warmup_steps": neutral(_SCHEDULE + "; DeepSpeed's warmup 'auto' is filled as their release fills it"),
    "warmup_ratio": neutral(_SCHEDULE + "; DeepSpeed's warmup 'auto' is filled as their release fills it"),
    "num_train_epochs": neutral("how long training runs (a probe runs a few steps)"),
    "max_steps": neutral("how long training runs (a probe runs a few steps); fills DeepSpeed's total_num_steps"),
    # the loss and the step
    "label_smoothing_factor": run("the Trainer's LabelSmoother over the logits (its own memory)"),
    "average_tokens_across_devices": run("an all-reduce of each step's token count, as their Trainer runs it"),
    "neftune_noise_alpha": run("NEFTune's noise on the input embeddings (their Trainer's hook)"),
    "torch_empty_cache_steps": run("the device cache emptied every N steps, as their Trainer does"),
    "use_cache": run("model.config.use_cache during training, as their Trainer sets it"),
    "full_determinism": run("deterministic algorithms (transformers' enable_full_determinism)"),
    # precision
    "bf16": run("the precision (held)"),
    "fp16": run("the precision (held)"),
    "bf16_full_eval": neutral("casts the model only in a standalone evaluate(); fills DeepSpeed's bf16 'auto'"),
    "fp16_full_eval": neutral("casts the model only in a standalone evaluate(); fills DeepSpeed's fp16 'auto'"),
    "tf32": run("TF32 matmuls on CUDA (speed); set as their TrainingArguments sets it, on a GPU host"),
    "half_precision_backend": neutral(
        "the mixed-precision backend", unless(_not_apex, "apex is gone from the Trainer"), "use 'auto'"
    ),
    "fp16_backend": neutral("4.x's name of half_precision_backend", unless(_not_apex, "apex"), "use 'auto'"),
    "fp16_opt_level": neutral("apex's level: used only with apex, which tuner refuses"),
    # activation checkpointing
    "gradient_checkpointing": run("activation checkpointing (searched)"),
    "activation_checkpointing": run("activation checkpointing (transformers 5's name; searched)"),
    "gradient_checkpointing_kwargs": run("passed to gradient_checkpointing_enable (use_reentrant ...)"),
    "activation_checkpointing_kwargs": run("passed to gradient_checkpointing_enable (use_reentrant ...)"),
    # compile and kernels
    "torch_compile": run("the model compiled as their Trainer compiles it (compile time is setup)"),
    "torch_compile_backend": run("torch.compile's backend"),
    "torch_compile_mode": run("torch.compile's mode"),
    "torchdynamo": run("transformers 4.x's name of torch_compile_backend"),
    "use_liger_kernel": run("Liger's kernels patched in as their Trainer does (where liger-kernel is installed)"),
    "liger_kernel_config": run("what Liger patches"),
    "jit_mode_eval": neutral(
        "TorchScript for inference", unless(falsy, "TorchScript-traced evaluation is not probed"), "set it false"
    ),
    # evaluation: when it runs, at which batch, what it keeps
    "eval_strategy": run('whether and when evaluation runs ("no": never)'),
    "eval_steps": run("how often evaluation runs"),
    "eval_delay": run("when evaluation starts"),
    "eval_on_start": run("an evaluation before the first step"),
    "do_eval": run("their script's evaluation (an eval phase)"),
    "do_predict": run("their script's predict pass (an eval phase)"),
    "prediction_loss_only": run("evaluation keeps no logits"),
    "eval_accumulation_steps": run("how many eval batches' outputs stay on the device before moving to the host"),
    "eval_do_concat_batches": neutral(_METRICS),
    "eval_use_gather_object": neutral(_METRICS),
    "include_for_metrics": neutral(_METRICS),
    "include_inputs_for_metrics": neutral(_METRICS),
    "batch_eval_metrics": neutral(_METRICS),
    "use_legacy_prediction_loop": neutral("the 4.x prediction loop: the same device memory"),
    "past_index": neutral(
        "XLNet / Transformer-XL memories", unless(lambda v: v in (None, -1), "past_index keeps mems"), "set it -1"
    ),
    "predict_with_generate": run("eval by generate (Seq2Seq)"),
    "generation_max_length": run("the generated length (Seq2Seq)"),
    "generation_num_beams": run("the beams (Seq2Seq)"),
    "generation_config": run(
        "the generation settings their Seq2SeqTrainer reads (max_new_tokens, num_beams)",
        unless(lambda v: v is None or isinstance(v, Mapping), "a path or hub id is read at their run, not here"),
        "write the generation config inline (max_new_tokens, num_beams ...)",
    ),
    "sortish_sampler": neutral("no Trainer of 4.57 or 5.x reads it"),
    # the sampler
    "train_sampling_strategy": run(
        "which samples share a batch (their sampler, on your data's lengths)",
        unless(lambda v: v in (None, "random", "sequential", "group_by_length"), "this sampler is not probed yet"),
        "search with random or group_by_length",
    ),
    "group_by_length": run("transformers 4.x's length-grouped sampler"),
    "length_column_name": neutral("where their lengths are read from (the probe reads your data's)"),
    # engines and distribution
    "deepspeed": run("your DeepSpeed config"),
    "fsdp": run("FSDP2 (as accelerate prepares it); FSDP1 is refused"),
    "fsdp_config": run("your FSDP settings"),
    "fsdp_min_num_params": neutral(
        "4.x's FSDP wrap threshold",
        unless(falsy, "4.x's top-level FSDP wrap setting is not read"),
        "write it in fsdp_config as min_num_params",
    ),
    "fsdp_transformer_layer_cls_to_wrap": neutral(
        "4.x's FSDP wrap classes",
        unless(falsy, "4.x's top-level FSDP wrap setting is not read"),
        "write it in fsdp_config as transformer_layer_cls_to_wrap",
    ),
    "ddp_find_unused_parameters": run("DDP's unused-parameter search (the torch engine on several ranks)"),
    "ddp_bucket_cap_mb": run("DDP's gradient buckets (the torch engine on several ranks)"),
    "ddp_broadcast_buffers": run("DDP's buffer broadcast (the torch engine on several ranks)"),
    "ddp_static_graph": run("DDP's static graph (the torch engine on several ranks)"),
    "ddp_backend": neutral("the process group backend: the probe runs nccl on GPUs, gloo on CPU"),
    "ddp_timeout": neutral("how long a collective may wait"),
    "accelerator_config": neutral(
        "accelerate's dataloader settings", _split_batches, "drop split_batches (tuner searches the per-device batch)"
    ),
    "parallelism_config": refused(
        "tensor / context / hybrid parallelism is not probed", "search without parallelism_config (data parallel)"
    ),
    "use_cpu": refused("your job trains on the CPU: tuner probes accelerator memory", "drop use_cpu"),
    "no_cuda": refused("your job trains on the CPU: tuner probes accelerator memory", "drop no_cuda"),
    "use_mps_device": neutral("Apple's MPS", unless(falsy, "MPS is not probed"), "drop use_mps_device"),
    "debug": neutral(
        "debug options",
        unless(falsy, "debug hooks (underflow_overflow, tpu_metrics_debug) are not probed"),
        "drop debug for the search",
    ),
    "tpu_num_cores": neutral("TPUs (not probed; unused on GPUs)"),
    "tpu_metrics_debug": neutral("TPUs", unless(falsy, "TPU metrics are not probed"), "drop it"),
    "mp_parameters": neutral("SageMaker model parallelism", unless(falsy, "not probed"), "drop it"),
    "per_gpu_train_batch_size": refused(
        "the deprecated per-GPU batch overrides per_device_train_batch_size",
        "rename it per_device_train_batch_size",
    ),
    "per_gpu_eval_batch_size": refused(
        "the deprecated per-GPU eval batch overrides per_device_eval_batch_size",
        "rename it per_device_eval_batch_size",
    ),
    "local_rank": neutral(_LAUNCHER),
    "seed": neutral("values, not memory or speed"),
    "data_seed": neutral("which samples come first (the worst batch is the data's, whatever the order)"),
    "skip_memory_metrics": neutral("the Trainer's host memory report"),
    "include_num_input_tokens_seen": neutral("a scalar gathered per step"),
    "include_tokens_per_second": neutral("a throughput report"),
    # the host's data loading
    "dataloader_drop_last": neutral(_DATA_HOST),
    "dataloader_num_workers": neutral(_DATA_HOST),
    "dataloader_pin_memory": neutral(_DATA_HOST),
    "dataloader_persistent_workers": neutral(_DATA_HOST),
    "dataloader_prefetch_factor": neutral(_DATA_HOST),
    "dataloader_multiprocessing_context": neutral(_DATA_HOST),
    "dataloader_in_order": neutral(_DATA_HOST),
    "remove_unused_columns": neutral(_DATA_HOST),
    "label_names": neutral("which inputs are labels (the probe's batches carry labels)"),
    "ignore_data_skip": neutral(_DATA_HOST),
    # saving and resuming
    "output_dir": neutral("where checkpoints go"),
    "overwrite_output_dir": neutral("where checkpoints go"),
    "save_strategy": neutral(_SAVE),
    "save_steps": neutral(_SAVE),
    "save_total_limit": neutral(_SAVE),
    "save_on_each_node": neutral(_SAVE),
    "save_only_model": neutral(_SAVE),
    "save_safetensors": neutral(_SAVE),
    "enable_jit_checkpoint": neutral(_SAVE),
    "load_best_model_at_end": neutral(_SAVE),
    "metric_for_best_model": neutral(_SAVE),
    "greater_is_better": neutral(_SAVE),
    "resume_from_checkpoint": neutral("where training resumes from"),
    "restore_callback_states_from_checkpoint": neutral("where training resumes from"),
    "do_train": neutral("their script's switch"),
    # logging and reporting
    "logging_strategy": neutral(_LOG),
    "logging_steps": neutral(_LOG + " (a host sync per logged step)"),
    "logging_first_step": neutral(_LOG),
    "logging_dir": neutral(_LOG),
    "log_on_each_node": neutral(_LOG),
    "logging_nan_inf_filter": neutral(_LOG),
    "log_level": neutral(_LOG),
    "log_level_replica": neutral(_LOG),
    "disable_tqdm": neutral(_LOG),
    "report_to": neutral(_LOG),
    "run_name": neutral(_LOG),
    "project": neutral(_LOG),
    "trackio_space_id": neutral(_LOG),
    "trackio_bucket_id": neutral(_LOG),
    "trackio_static_space_id": neutral(_LOG),
    "ray_scope": neutral("hyperparameter search"),
    # the Hub
    "push_to_hub": neutral(_HUB),
    "hub_token": neutral(_HUB),
    "hub_private_repo": neutral(_HUB),
    "hub_model_id": neutral(_HUB),
    "hub_strategy": neutral(_HUB),
    "hub_always_push": neutral(_HUB),
    "hub_revision": neutral(_HUB),
    "push_to_hub_model_id": neutral(_HUB),
    "push_to_hub_organization": neutral(_HUB),
    "push_to_hub_token": neutral(_HUB),
}
