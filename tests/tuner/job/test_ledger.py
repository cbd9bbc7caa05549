"""The ledger (tuner.job.ledger) against the releases themselves: every field of TrainingArguments and
Seq2SeqTrainingArguments of each supported transformers release (this venv's, and 5.17.0 / 4.57.3 installed beside it
with pip --target, as tests/tuner/interop/test_trainer_releases.py installs them) has a verdict, and the field lists
tuner reads without importing transformers are that release's own. A new release's field fails here until someone
decides what a probe does with it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.tuner.interop.test_trainer_releases import release_folder
from tuner.job.ledger import NEUTRAL, REFUSED, RUN
from tuner.job.ledger.releases import SUPPORTED, every_field, release_fields
from tuner.job.ledger.training_args import TRAINING_ARGS

FIELDS = r"""
import dataclasses, json, sys, transformers
from transformers import Seq2SeqTrainingArguments, TrainingArguments
ta = [f.name for f in dataclasses.fields(TrainingArguments) if f.init]
s2s = [f.name for f in dataclasses.fields(Seq2SeqTrainingArguments) if f.init and f.name not in ta]
print(json.dumps({"release": transformers.__version__, "ta": ta, "s2s": s2s}))
"""


def installed_fields(version: str) -> dict:
    """The fields of transformers ``version`` as its own dataclasses list them (a subprocess: the venv's release, or
    an older one from its --target folder shadowing it)."""
    import os

    from transformers import __version__ as venv_release

    env = dict(os.environ)
    if version != venv_release:
        env["PYTHONPATH"] = str(release_folder(version))
    done = subprocess.run([sys.executable, "-c", FIELDS], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["release"] == version
    return found


def test_this_venvs_release_is_supported() -> None:
    from transformers import __version__

    assert __version__ in SUPPORTED, f"transformers {__version__}: add its fields (python -m scripts.ledger_fields)"


@pytest.mark.parametrize("version", SUPPORTED)
def test_every_field_of_each_release_has_a_verdict_and_the_stored_list_is_the_releases(version: str) -> None:
    found = installed_fields(version)
    stored = release_fields(version)
    assert stored.release == version
    assert set(found["ta"]) == stored.training_args
    assert set(found["s2s"]) == stored.seq2seq
    missing = sorted((set(found["ta"]) | set(found["s2s"])) - set(TRAINING_ARGS))
    assert not missing, f"fields of transformers {version} nobody classified: {missing}"


def test_the_ledger_holds_no_field_of_no_release_and_every_verdict_says_why() -> None:
    assert set(TRAINING_ARGS) == every_field()
    for name, entry in TRAINING_ARGS.items():
        assert entry.verdict in (RUN, NEUTRAL, REFUSED) and entry.why, name
        assert entry.verdict != REFUSED or entry.fix, f"{name}: a refusal says the fix"


def test_every_key_of_accelerates_cluster_config_has_a_verdict() -> None:
    import dataclasses

    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.commands.launch import launch_command_parser

    from tuner.job.ledger.accelerate import ACCELERATE_KEYS, DYNAMO_KEYS

    fields = {f.name for f in dataclasses.fields(ClusterConfig)}
    assert not fields - set(ACCELERATE_KEYS), (
        f"accelerate config keys nobody classified: {fields - set(ACCELERATE_KEYS)}"
    )
    # the launcher's --dynamo_* options are the dynamo_config block's keys (accelerate launch reads them from there)
    options = {a.dest for a in launch_command_parser()._actions if a.dest.startswith("dynamo_")}
    assert options == set(DYNAMO_KEYS)


def test_every_key_of_accelerates_deepspeed_plugin_block_has_a_verdict() -> None:
    """The deepspeed_config block's keys are `accelerate launch`'s DeepSpeed arguments (it copies each key of the
    block onto its argument of that name and hands it to the training process)."""
    from accelerate.commands.launch import launch_command_parser

    from tuner.job.ledger import REFUSED
    from tuner.job.ledger.accelerate import DEEPSPEED_PLUGIN_KEYS

    groups = [g for g in launch_command_parser()._action_groups if g.title == "DeepSpeed Arguments"]
    options = {a.dest for g in groups for a in g._group_actions}
    assert len(options) > 10 and options == set(DEEPSPEED_PLUGIN_KEYS)
    for name, entry in DEEPSPEED_PLUGIN_KEYS.items():
        assert entry.why and (entry.verdict != REFUSED or entry.fix), name


READS = r"""
import json, os, sys
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
class Recording(dict):
    seen = set()
    def get(self, k, d=None):
        Recording.seen.add(k)
        return super().get(k, d)
    def __contains__(self, k):
        Recording.seen.add(k)
        return super().__contains__(k)
    def __getitem__(self, k):
        Recording.seen.add(k)
        return super().__getitem__(k)
from deepspeed.runtime.config import DeepSpeedConfig
DeepSpeedConfig(Recording({"train_batch_size": 2, "train_micro_batch_size_per_gpu": 2}))
print(json.dumps(sorted(k for k in Recording.seen if isinstance(k, str))))
"""


def test_every_top_level_key_the_installed_deepspeed_reads_has_a_verdict() -> None:
    from tuner.job.ledger.deepspeed import DEEPSPEED_KEYS

    done = subprocess.run([sys.executable, "-c", READS], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    read = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert len(read) > 40  # DeepSpeedConfig's own reads (0.19: 54), recorded as it makes them
    missing = read - set(DEEPSPEED_KEYS)
    assert not missing, f"DeepSpeed keys nobody classified: {sorted(missing)}"
