"""The examples in the Python API's docstrings run as written (doctest): tuner.estimate here, tuner.tune,
tuner.best_config and TunerCallback in one real search and one real Trainer run (slow)."""

from __future__ import annotations

import doctest
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tuner
from tests.helpers.servers import one_rank_env
from tuner.integrations.transformers import TunerCallback

PUBLIC = {
    "tune": tuner.tune,
    "best_config": tuner.best_config,
    "estimate": tuner.estimate,
    "TunerCallback": TunerCallback,
}
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _examples(obj: object) -> list[doctest.Example]:
    return doctest.DocTestParser().get_examples(obj.__doc__ or "")


@pytest.mark.parametrize("name", list(PUBLIC))
def test_every_public_function_carries_an_example_that_compiles(name: str) -> None:
    examples = _examples(PUBLIC[name])
    assert len(examples) >= 2, f"{name} has no runnable example in its docstring"
    for example in examples:
        compile(example.source, f"<{name} example>", "single")


def test_the_estimate_example_runs() -> None:
    test = doctest.DocTestParser().get_doctest(tuner.estimate.__doc__ or "", {}, "tuner.estimate", None, 0)
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    runner.run(test)
    assert runner.failures == 0 and runner.tries == len(test.examples) > 0


SCRIPT = textwrap.dedent(
    """
    import doctest, sys
    import torch
    import tuner
    from trials.contract import ModelSpec
    from trials.models import build_model
    from tuner.integrations.transformers import TunerCallback

    class Data(torch.utils.data.Dataset):  # the user's own data: token ids of their length
        def __len__(self):
            return 64
        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            ids = torch.randint(3, 512, (32,), generator=g)
            return {"input_ids": ids, "attention_mask": torch.ones(32, dtype=torch.long), "labels": ids}

    class Checker(doctest.OutputChecker):
        # an example that shows no output claims none: what DeepSpeed and the Trainer log while it runs is not
        # compared; every example that shows output is compared as usual

        def check_output(self, want, got, optionflags):
            return want == "" or super().check_output(want, got, optionflags)

    globs = {"model": build_model(ModelSpec()), "train_dataset": Data()}  # and what each example defines, in turn
    parser = doctest.DocTestParser()
    runner = doctest.DocTestRunner(checker=Checker(), optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for name, obj in (("tune", tuner.tune), ("best_config", tuner.best_config), ("TunerCallback", TunerCallback)):
        test = parser.get_doctest(obj.__doc__, globs, name, None, 0)  # a DocTest runs in a copy of the globals
        runner.run(test, clear_globs=False)
        globs.update(test.globs)
    print(f"RAN {runner.tries} FAILED {runner.failures}")
    sys.exit(1 if runner.failures or not runner.tries else 0)
    """
)


@pytest.mark.slow
def test_the_tune_best_config_and_callback_examples_run(tmp_path: Path) -> None:
    """In a fresh directory (the examples' sqlite:///tuner.db), in one process as a user would run them one after
    the other: a real search of the tiny T5, its best config, then a Seq2SeqTrainer run recorded by the callback."""
    env = one_rank_env(PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=1500
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "FAILED 0" in done.stdout
