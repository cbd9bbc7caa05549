"""Writes the field lists of the TRL release on the path for the ledger (tuner/job/ledger/fields/trl-X.json):
SFTConfig's and DPOConfig's fields beyond TrainingArguments' (and their defaults), ModelConfig's all, and the
TrainingArguments defaults each config changes (its dataclass default against TrainingArguments'). TRL stays out of
the venv: run it as `PYTHONPATH=DIR .venv/bin/python scripts/ledger_trl_fields.py` where DIR holds
`pip install --target DIR --no-deps trl==X`; then classify every new field in tuner/job/ledger/trl.py
(tests/tuner/job/test_ledger_trl.py fails until each has a verdict)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

FOLDER = Path(__file__).resolve().parents[1] / "tuner" / "job" / "ledger" / "fields"


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def trl_fields() -> dict[str, Any]:
    """What the ledger records of the TRL release importable here (JSON-able)."""
    import trl
    from transformers import TrainingArguments
    from trl import DPOConfig, ModelConfig, SFTConfig

    base = {f.name: _default(f) for f in dataclasses.fields(TrainingArguments) if f.init}
    out: dict[str, Any] = {"release": trl.__version__}
    for cls in (SFTConfig, DPOConfig):
        own = {f.name: _default(f) for f in dataclasses.fields(cls) if f.init}
        out[cls.__name__] = [n for n in own if n not in base]
        out[f"{cls.__name__}_own_defaults"] = {
            n: v for n, v in own.items() if n not in base and isinstance(v, (bool, int, float, str, type(None)))
        }
        out[f"{cls.__name__}_defaults"] = {
            n: v for n, v in own.items() if n in base and v != base[n] and isinstance(v, (bool, int, float, str))
        } | {n: v for n, v in own.items() if n in base and v is None and base[n] is not None}
    model = [f for f in dataclasses.fields(ModelConfig) if f.init]
    out["ModelConfig"] = [f.name for f in model]
    out["ModelConfig_defaults"] = {f.name: _default(f) for f in model if f.name.startswith(("lora_", "use_", "dtype"))}
    return out


def main() -> None:
    body = trl_fields()
    out = FOLDER / f"trl-{body['release']}.json"
    out.write_text(json.dumps(body, indent=0) + "\n")
    sizes = ", ".join(f"{k} {len(v)}" for k, v in body.items() if isinstance(v, list))
    print(f"wrote {out} ({sizes})")


if __name__ == "__main__":
    main()
