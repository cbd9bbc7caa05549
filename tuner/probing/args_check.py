"""Before any probe launches: their TrainingArguments' own verdict on their training args.

The probe builds its TrainingArguments from the user's (trials.trainer_args), so their release's checks run in every
probe; a file it refuses (``load_best_model_at_end`` with mismatched strategies, a key it does not know, an optimizer
whose package is missing ...) would be refused by every probe alike. ``check_trainer_args`` asks once, in a
subprocess (the tuner's process imports neither torch nor transformers), and the search and its dry run stop with
their reason in one line, exit 2, before a study is written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner.errors import BaselineError

CHECK_TIMEOUT_S = 180.0


def trainer_args_refusal(
    args: Mapping[str, Any], seq2seq: bool, precision: str, env: Mapping[str, str] | None = None
) -> str | None:
    """Their TrainingArguments' refusal of ``args`` (python -m trials.trainer_args), None when they take them or the
    check could not run (a probe then meets the refusal itself)."""
    request = {"trainer_args": dict(args), "seq2seq": seq2seq, "precision": precision}
    with tempfile.TemporaryDirectory(prefix="tuner-args-") as tmp:
        out = Path(tmp) / "verdict.json"
        try:
            done = subprocess.run(
                [sys.executable, "-m", "trials.trainer_args", str(out)],
                input=json.dumps(request),
                capture_output=True,
                text=True,
                env=dict(env if env is not None else os.environ),
                timeout=CHECK_TIMEOUT_S,
                check=False,
            )
            said = json.loads(out.read_text(encoding="utf-8")) if done.returncode == 0 else None
        except (OSError, ValueError, subprocess.TimeoutExpired):
            return None
    if not isinstance(said, dict) or said.get("refusal") is None:
        return None
    return f"{said['refusal']} (transformers {said.get('transformers')})"


def check_trainer_args(job: Any) -> None:
    """A BaselineError (one line, exit 2) when their TrainingArguments refuse the job's training args."""
    if job is None or job.trainer_args is None:
        return
    refusal = trainer_args_refusal(job.trainer_args, job.seq2seq_args, job.precision)
    if refusal is not None:
        raise BaselineError(refusal)
