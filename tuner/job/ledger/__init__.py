"""The ledger: every field of the user's files, with what a probe does with it.

One table per source (TrainingArguments / Seq2SeqTrainingArguments of each supported transformers release:
``tuner.job.ledger.training_args``; the accelerate config: ``tuner.job.ledger.accelerate``; the DeepSpeed JSON:
``tuner.job.ledger.deepspeed``). Each field has one of three verdicts:

- **run**: the probe does what the library does with it (the probe's TrainingArguments are built from the user's, and
  the Trainer's own code resolves the optimizer, the label smoother, NEFTune ...);
- **neutral**: it changes neither device memory nor speed (logging, hub, output paths): kept in the exports, and why
  in a word;
- **refused**: it changes memory or speed and the probe cannot run it here: one line naming the field, why, and the
  fix.

Some fields are run or neutral at most values and refused at a few (``debug: underflow_overflow``): ``Entry.refuse``
says which. tests/tuner/job/test_ledger.py enumerates the fields of every supported release (``dataclasses.fields``)
and fails on one nobody classified. Pure: no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

Verdict = Literal["run", "neutral", "refused"]
RUN: Verdict = "run"
NEUTRAL: Verdict = "neutral"
REFUSED: Verdict = "refused"

#: a value test: None when the value is fine, else why it is refused (the Entry's ``fix`` follows it)
Refusal = Callable[[Any], "str | None"]


@dataclass(frozen=True)
class Entry:
    """What a probe does with one field: its verdict, why (a few words), and for a refusal the fix. ``refuse``: the
    values refused although the verdict is run or neutral (None: none)."""

    verdict: Verdict
    why: str
    fix: str | None = None
    refuse: Refusal | None = None

    def refusal(self, value: Any) -> str | None:
        """Why ``value`` is refused (None: it is not)."""
        if self.verdict == REFUSED:
            return self.why
        return self.refuse(value) if self.refuse is not None else None


def run(why: str, refuse: Refusal | None = None, fix: str | None = None) -> Entry:
    return Entry(RUN, why, fix, refuse)


def neutral(why: str, refuse: Refusal | None = None, fix: str | None = None) -> Entry:
    return Entry(NEUTRAL, why, fix, refuse)


def refused(why: str, fix: str) -> Entry:
    return Entry(REFUSED, why, fix)


def unless(allowed: Callable[[Any], bool], why: str) -> Refusal:
    """A value test refusing what ``allowed`` does not accept, saying ``why``."""
    return lambda value: None if allowed(value) else why


def falsy(value: Any) -> bool:
    return value in (None, False, "", [], {}, 0)
