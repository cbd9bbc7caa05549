"""The GPU check's cut of the offloaded setup (issue 41 §4): the team's baseline probed once per pinned-memory variant
(trials.contract_pinned: ``deepspeed`` as DeepSpeed does it, ``register:N`` torch's host-register pinning, ``exact``
in place at the exact size), each a setting of the probe's environment only (the runner's ``pinned_alloc``), one
after the other on one fork server; the fastest setup is kept for the rest of the check.

    python3 -m benchmarks.gpu.pinned_step OPTIONS_JSON CHOICE_FILE BOX_S

OPTIONS_JSON holds the search's settings (tuner.session.options.SearchOptions' names); the baseline config is built
as the search builds trial 0 (their files, "auto" filled as their Trainer fills it), shortened to its setup and the
fewest cycles a probe runs (no eval, no generate): what differs between the variants is the engine's setup. One line
per variant (its fixed cost and the engine's parts), then the choice, also written to CHOICE_FILE."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trials.contract import DEFAULT_PINNED_ALLOC, ProbeConfig, ProbeResult, Status, register_threads
from tuner.probing.runner import ProbeRunner
from tuner.records import Fidelity
from tuner.search.setup import SearchSetup
from tuner.session.options import SearchOptions
from tuner.session.session import SearchSession
from tuner.settings import load_settings

#: a variant replaces the default only when its setup is faster by more than this share (the default is what the
#: user's own run does; a difference inside the noise of one probe each is no reason to leave it)
MARGIN = 0.05
LEAST_S = 15.0  # the least one variant's probe is given (a forked rank's setup of a model built on the GPU)


def variants(cores: int) -> list[str]:
    """The variants compared, the default first."""
    return [DEFAULT_PINNED_ALLOC, f"register:{register_threads(cores)}", "exact"]


@dataclass(frozen=True)
class Tried:
    """One variant's probe: its status and fixed cost (None where it measured none)."""

    variant: str
    status: str
    setup_s: float | None
    parts: dict[str, float]

    def line(self) -> str:
        """One line: the fixed cost (launch to the first step) and the engine's setup in parts."""
        if self.setup_s is None:
            return f"pinned {self.variant}: {self.status}, no fixed cost measured"
        said = [
            f"{v:.1f} GiB pinned" if k == "engine.pinned_gib" else f"{k.removeprefix('engine.')} {v:.1f} s"
            for k, v in self.parts.items()
        ]
        return f"pinned {self.variant}: {self.status}, fixed cost {self.setup_s:.1f} s [{', '.join(said)}]"


def measured(t: Tried) -> bool:
    """Its setup ran to the first step: an ok probe, or one that ran out of memory after it (the emulated device's
    160 MiB and their 2e8 buckets: the setup is whole, the step is what did not fit)."""
    return t.setup_s is not None and t.status in (Status.OK, Status.OOM)


def fastest(tried: Sequence[Tried], margin: float = MARGIN) -> tuple[str, str]:
    """The variant to keep and why: the fastest measured setup, unless the default's is within ``margin`` of it (or
    no variant measured one: then the default)."""
    ok = [t for t in tried if measured(t)]
    if not ok:
        return DEFAULT_PINNED_ALLOC, "no variant measured a setup: the default kept"
    best = min(ok, key=lambda t: t.setup_s or 0.0)
    default = next((t for t in ok if t.variant == DEFAULT_PINNED_ALLOC), None)
    if default is None:
        return best.variant, f"{best.variant} ({best.setup_s:.1f} s; the default measured none)"
    if best is default or (best.setup_s or 0.0) >= (default.setup_s or 0.0) * (1 - margin):
        return default.variant, f"the default ({default.setup_s:.1f} s; none faster by more than {margin:.0%})"
    return best.variant, f"{best.variant}: {best.setup_s:.1f} s against the default's {default.setup_s:.1f} s"


def setup_probe(config: ProbeConfig) -> ProbeConfig:
    """The baseline's probe shortened to its setup and the fewest cycles: no eval, no generate, one measured step."""
    knobs = config.knobs.model_copy(update={"eval_batch_size": None, "generate": False})
    return config.model_copy(update={"knobs": knobs, "warmup_steps": 1, "measure_steps": 1, "max_measure_steps": 1})


def baseline_probe(options: dict[str, Any], timeout_s: float) -> ProbeConfig:
    """Trial 0's probe config as the search would build it from ``options``."""
    session = SearchSession(SearchOptions.of({**options, "given": frozenset(options.get("given", ()))}))
    request, _ = session.request()
    if request.baseline is None:
        raise ValueError("the check's options name no baseline")
    return SearchSetup.of(request).probe_config(request.baseline, Fidelity.BASELINE, timeout_s)


def tried(variant: str, result: ProbeResult) -> Tried:
    parts = {k: v for k, v in (result.setup_phases or {}).items() if k.startswith("engine")}
    return Tried(variant, str(result.status), result.setup_s, parts)


def main(argv: list[str]) -> int:
    options, choice_file, box_s = json.loads(Path(argv[0]).read_text()), Path(argv[1]), float(argv[2])
    end = time.monotonic() + box_s
    todo = variants(os.cpu_count() or 1)
    config = setup_probe(baseline_probe(options, box_s / len(todo)))
    results = []
    for i, variant in enumerate(todo):
        left = end - time.monotonic()
        if left < LEAST_S:
            print(f"pinned {variant}: not run ({left:.0f} s left of the step's box)")
            continue
        runner = ProbeRunner(load_settings(storage=options["storage"], pinned_alloc=variant))
        timeout = left - LEAST_S * (len(todo) - i - 1)  # what is left, less the least each later variant needs
        results.append(tried(variant, runner(config.model_copy(update={"timeout_s": max(LEAST_S, timeout)}))))
        print(results[-1].line(), flush=True)
    keep, why = fastest(results)
    choice_file.write_text(keep)
    print(f"pinned: kept {keep} for the search and the crash study: {why}")
    return 0 if any(measured(t) for t in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
