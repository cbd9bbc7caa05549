"""The fields of TrainingArguments / Seq2SeqTrainingArguments in each supported transformers release (the JSON files
beside this module, written by scripts/ledger_fields.py from the release itself; tests/tuner/job/
test_ledger.py checks them against each installed release). Pure: no transformers import."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources

from tuner.interop.trainer_fill import host_transformers, parse_version

#: the releases whose fields tuner knows, oldest first
SUPPORTED: tuple[str, ...] = ("4.57.3", "5.17.0", "5.25.0")


@dataclass(frozen=True)
class ReleaseFields:
    release: str  # the release whose lists these are
    training_args: frozenset[str]
    seq2seq: frozenset[str]  # Seq2SeqTrainingArguments' own, beyond TrainingArguments'
    asked: str | None = None  # the release the user trains on, where it differs from ``release``

    @property
    def named(self) -> str:
        if self.asked and self.asked != self.release:
            return f"transformers {self.asked} (read with {self.release}'s fields, the nearest tuner knows)"
        return f"transformers {self.release}"

    def has(self, name: str, seq2seq: bool = True) -> bool:
        return name in self.training_args or (seq2seq and name in self.seq2seq)


@functools.cache
def _load(release: str) -> ReleaseFields:
    text = resources.files("tuner.job.ledger").joinpath(f"fields/transformers-{release}.json").read_text()
    data = json.loads(text)
    return ReleaseFields(
        release=data["release"],
        training_args=frozenset(data["TrainingArguments"]),
        seq2seq=frozenset(data["Seq2SeqTrainingArguments"]),
    )


def release_fields(version: str | None) -> ReleaseFields:
    """The fields of transformers ``version`` (None: this host's): its own list when tuner has it, else the nearest
    supported release at or below it (the oldest for an older one), named so in messages."""
    asked = version or host_transformers()
    parsed = parse_version(asked)
    if asked in SUPPORTED:
        return _load(asked)
    chosen = SUPPORTED[-1]
    if parsed is not None:
        below = [r for r in SUPPORTED if parse_version(r) <= parsed]  # type: ignore[operator]
        chosen = below[-1] if below else SUPPORTED[0]
    fields = _load(chosen)
    return ReleaseFields(fields.release, fields.training_args, fields.seq2seq, asked=asked)


def releases_with(name: str) -> list[str]:
    """The supported releases whose TrainingArguments (or Seq2Seq's) have field ``name``."""
    return [r for r in SUPPORTED if _load(r).has(name)]


def every_field() -> frozenset[str]:
    """Every field of every supported release (what the ledger must classify)."""
    out: set[str] = set()
    for release in SUPPORTED:
        fields = _load(release)
        out |= fields.training_args | fields.seq2seq
    return frozenset(out)
