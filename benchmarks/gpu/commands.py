"""The GPU check's command lines (pure, stdlib only): the search, the crash study, the explains, the Trainer, the
tables, the pinned variants' options, and the commands that rerun the CPU traces on the CPU host from the files
$OUT brings back."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from benchmarks.gpu.plan import CheckConfig

SEARCH_STUDY = "gpu-check"
CRASH_STUDY = "crash"
# their run started (it crashed hundreds of samples in): their Trainer filled WarmupLR's warmup >= 1, as transformers
# >= 5.18 does; on a host whose transformers fills 0 (5.17 on the first H200) their files as this host fills them are
# refused before launching, which the main search shows; the crash and the pinned variants run as their Trainer ran
THEIR_TRANSFORMERS = "5.18.0"


@dataclass(frozen=True)
class Paths:
    """Where the check works: the repository (the team's files under tests/data/seed), its work folder, the study
    database."""

    repo: Path
    work: Path

    @property
    def seed(self) -> Path:
        return self.repo / "tests" / "data" / "seed"

    @property
    def training_args(self) -> Path:
        """Their training args as a transformers 5 Trainer takes them: tests/data/seed's without
        overwrite_output_dir (a 4.x field, gone in 5.0: tuner's ledger refuses it on a 5.x host, as their Trainer
        would); written by ``write_inputs``."""
        return self.work / "training_args.json"

    @property
    def db_file(self) -> Path:
        return self.work / "gpu-check.db"

    @property
    def db(self) -> str:
        return f"sqlite:///{self.db_file}"

    @property
    def space(self) -> Path:
        return self.work / "space.yaml"

    @property
    def crash_space(self) -> Path:
        return self.work / "crash.yaml"


def space_yaml(micro: str, length: int, bucket: int, searched: bool) -> str:
    """The search's space around their config (micro batch, offload, overlap_comm and checkpointing searched), or
    their config alone (``searched`` False: the crash)."""

    def pick(both: str, theirs: str) -> str:
        return both if searched else theirs

    return "\n".join(
        [
            f"micro_batch_size: {pick(micro, '[2]')}",
            f"max_length: [{length}]",
            "engine: [deepspeed]",
            "zero_stage: [2]",
            f"allgather_bucket_size: [{bucket if searched else 200_000_000}]",
            f"reduce_bucket_size: [{bucket if searched else 200_000_000}]",
            f"overlap_comm: {pick('[true, false]', '[true]')}",
            "contiguous_gradients: [true]",
            f"offload_optimizer: {pick('[true, false]', '[true]')}",
            f"gradient_checkpointing: {pick('[false, true]', '[false]')}",
            "precision: [bf16]",
            "",
        ]
    )


def job_args(config: CheckConfig, paths: Paths, length: int, memory: str) -> list[str]:
    """The team's job: their files as the baseline, one rank, the lengths and the cap; global batch 8 as a change
    asked for (their files make 2 on one rank: micro 2 x accumulation 1), so micro 2, 4 and 8 all reach it."""
    job = config.job
    return [
        "--model", job.model,
        "--baseline", str(paths.seed / "ds_config.json"),
        "--training-args", str(paths.training_args),
        "--world-size", "1",
        "--global-batch", "8",
        "--change-global-batch",
        "--max-length", str(length),
        "--max-target-length", str(job.target_length),
        "--generation-max-length", str(job.target_length),
        "--eval-batch-size", str(job.eval_batch),
        "--device-memory", memory,
    ]  # fmt: skip


def search_args(config: CheckConfig, paths: Paths, budget_s: float) -> list[str]:
    job = config.job
    return [
        "search", "--budget", f"{budget_s:.0f}s", "--space", str(paths.space), "--storage", paths.db,
        "--study", SEARCH_STUDY, "--seed", "0", "--finalists", "1", "--no-estimate",
        *job_args(config, paths, job.max_length, job.device_memory),
    ]  # fmt: skip


def crash_args(config: CheckConfig, paths: Paths, budget_s: float) -> list[str]:
    job = config.job
    return [
        "search", "--budget", f"{budget_s:.0f}s", "--space", str(paths.crash_space), "--storage", paths.db,
        "--study", CRASH_STUDY, "--n-trials", "1", "--seed", "0", "--finalists", "0", "--no-estimate",
        "--transformers-version", THEIR_TRANSFORMERS,
        *job_args(config, paths, job.crash_length, job.crash_memory),
    ]  # fmt: skip


def oom_message_args(config: CheckConfig, paths: Paths, storage: str) -> list[str]:
    """`tuner explain --oom-message` of their OOM text at their worst batch (a CPU trace)."""
    job = config.job
    return [
        "explain", "--storage", storage, "--oom-message", f"@{paths.seed / 'oom.txt'}",
        *job_args(config, paths, job.crash_length, job.crash_memory),
    ]  # fmt: skip


def trial_explain_args(storage: str, trial: int) -> list[str]:
    return ["explain", "--storage", storage, "--study", SEARCH_STUDY, "--trial", str(trial)]


def pinned_options(config: CheckConfig, paths: Paths) -> dict[str, object]:
    """The search's settings for the pinned variants' baseline (tuner.session.options.SearchOptions' names), on a
    scratch database: trial 0 as the search builds it, "auto" filled as their Trainer filled it."""
    job = config.job
    return {
        "budget": "60s",
        "model": job.model,
        "space": str(paths.space),
        "storage": f"sqlite:///{paths.work / 'pinned.db'}",
        "study": "pinned",
        "baseline": str(paths.seed / "ds_config.json"),
        "training_args": str(paths.training_args),
        "transformers_version": THEIR_TRANSFORMERS,
        "world_size": 1,
        "global_batch": 8,
        "change_global_batch": True,  # as job_args: a change to their files' 2
        "given": ["model"],  # the model is named, not the default (a CPU dry run names the default's preset)
        "seed": 0,
        "device_memory": job.device_memory,
        "max_length": job.max_length,
        "max_target_length": job.target_length,
        "generation_max_length": job.target_length,
        "eval_batch_size": job.eval_batch,
        "estimate": False,
    }


def write_inputs(config: CheckConfig, paths: Paths) -> Path:
    """The spaces and the pinned variants' options, in the work folder; the options file's path."""
    job = config.job
    theirs = json.loads((paths.seed / "training_args.json").read_text())
    theirs.pop("overwrite_output_dir", None)  # a 4.x field: their files as a 5.x Trainer takes them
    theirs["deepspeed"] = str(paths.seed / "ds_config.json")
    paths.training_args.write_text(json.dumps(theirs, indent=1))
    paths.space.write_text(space_yaml(job.micro, job.max_length, job.bucket, searched=True))
    paths.crash_space.write_text(space_yaml(job.micro, job.crash_length, job.bucket, searched=False))
    options = paths.work / "pinned-options.json"
    options.write_text(json.dumps(pinned_options(config, paths), indent=1))
    return options


#: the transformers release the team's own training args were written for (they carry 4.x's overwrite_output_dir)
SEED_RELEASE = "4.57.3"


def on_the_cpu_host(args: list[str], paths: Paths) -> str:
    """A `python -m tuner` command as it reruns in a checkout on the CPU host, beside the returned files: the
    database and the seed files by their paths there. The 5.x copy of their training args (``Paths.training_args``,
    not returned) reads there as their own file at the 4.x release it was written for."""
    if str(paths.training_args) in args:
        at = args.index(str(paths.training_args))
        args = [*args[:at], str(paths.seed / "training_args.json"), *args[at + 1 :]]
        if "--transformers-version" not in args:
            args += ["--transformers-version", SEED_RELEASE]
    text = shlex.join(["python", "-m", "tuner", *args])
    text = text.replace(f"sqlite:///{paths.work}/copy.db", "sqlite:///gpu-check.db")  # the background readers' copy
    text = text.replace(f"sqlite:///{paths.work}/", "sqlite:///")  # the study's database, explain's scratch one
    return text.replace(str(paths.repo) + "/", "")


def unzip_snapshot(snapshot: str) -> str:
    """The command that puts a returned snapshot back where the database's row names it."""
    folder = shlex.quote(str(Path(snapshot).parent))
    return f"mkdir -p {folder} && gunzip -c oom-snapshot.pickle.gz > {shlex.quote(snapshot)}"  # evidence.OOM_SNAPSHOT


__all__ = [
    "CRASH_STUDY",
    "SEARCH_STUDY",
    "Paths",
    "crash_args",
    "job_args",
    "on_the_cpu_host",
    "oom_message_args",
    "pinned_options",
    "search_args",
    "space_yaml",
    "trial_explain_args",
    "unzip_snapshot",
    "write_inputs",
]
