"""Writes the field lists of the installed transformers release for the ledger (tuner/job/ledger/fields/): run it with
each supported release on the path, e.g. `PYTHONPATH=DIR .venv/bin/python scripts/ledger_fields.py` where DIR holds
`pip install --target DIR --no-deps transformers==X`; then classify every new field in
tuner/job/ledger/training_args.py (tests/tuner/job/test_ledger.py fails until each has a verdict)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import transformers
from transformers import Seq2SeqTrainingArguments, TrainingArguments

FOLDER = Path(__file__).resolve().parents[1] / "tuner" / "job" / "ledger" / "fields"


def main() -> None:
    ta = [f.name for f in dataclasses.fields(TrainingArguments) if f.init]
    s2s = [f.name for f in dataclasses.fields(Seq2SeqTrainingArguments) if f.init and f.name not in ta]
    out = FOLDER / f"transformers-{transformers.__version__}.json"
    body = {"release": transformers.__version__, "TrainingArguments": ta, "Seq2SeqTrainingArguments": s2s}
    out.write_text(json.dumps(body, indent=0) + "\n")
    print(f"wrote {out} ({len(ta)} + {len(s2s)} fields); add the release to tuner.job.ledger.releases.SUPPORTED")


if __name__ == "__main__":
    main()
