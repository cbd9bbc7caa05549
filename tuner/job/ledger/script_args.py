"""Keys a training-args JSON often carries beside TrainingArguments' own: the example scripts' ModelArguments and
DataTrainingArguments (HfArgumentParser reads one JSON into several dataclasses: run_seq2seq.py, run_clm.py,
run_summarization.py ...). tuner reads their lengths; the rest are the script's business, kept in the exports."""

from __future__ import annotations

from tuner.job.ledger import Entry, neutral, run

_LENGTH = "the job's length (the probe pads to it; your data truncates there)"
_SCRIPT = "your script's own argument"

SCRIPT_ARGS: dict[str, Entry] = {
    "max_source_length": run(_LENGTH),
    "max_seq_length": run(_LENGTH),
    "max_length": run(_LENGTH),
    "model_max_length": run(_LENGTH),
    "max_target_length": run("the job's label length"),
    "val_max_target_length": run("the job's label length"),
    "model_name_or_path": neutral("your script's model: tuner probes the one --model names"),
    "config_name": neutral(_SCRIPT),
    "tokenizer_name": neutral(_SCRIPT),
    "cache_dir": neutral(_SCRIPT),
    "use_fast_tokenizer": neutral(_SCRIPT),
    "model_revision": neutral(_SCRIPT),
    "token": neutral(_SCRIPT),
    "trust_remote_code": neutral(_SCRIPT + " (tuner asks `tuner --trust-remote-code`)"),
    "dataset_name": neutral(_SCRIPT + " (give tuner your data with --dataset)"),
    "dataset_config_name": neutral(_SCRIPT),
    "text_column": neutral(_SCRIPT),
    "summary_column": neutral(_SCRIPT),
    "train_file": neutral(_SCRIPT + " (give tuner your data with --dataset)"),
    "validation_file": neutral(_SCRIPT),
    "test_file": neutral(_SCRIPT),
    "overwrite_cache": neutral(_SCRIPT),
    "preprocessing_num_workers": neutral(_SCRIPT),
    "max_train_samples": neutral(_SCRIPT),
    "max_eval_samples": neutral(_SCRIPT),
    "max_predict_samples": neutral(_SCRIPT),
    "pad_to_max_length": neutral(_SCRIPT + " (tuner pads as --padding says)"),
    "ignore_pad_token_for_loss": neutral(_SCRIPT),
    "source_prefix": neutral(_SCRIPT),
    "source_lang": neutral(_SCRIPT),
    "target_lang": neutral(_SCRIPT),
    "lang": neutral(_SCRIPT),
    "forced_bos_token": neutral(_SCRIPT),
    "num_beams": run("the beams of an eval generate"),
}
