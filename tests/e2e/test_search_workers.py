"""Two `tuner search --study S` workers on one PostgreSQL study at once (Optuna's distributed mode + our claims)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import optuna
import pytest

TUNER = str(Path(sys.executable).with_name("tuner"))
SPACE = "micro_batch_size: [1, 2, 4, 32]\nzero_stage: [0]\ngradient_checkpointing: [false]\n"


@pytest.mark.slow
@pytest.mark.postgres
def test_two_workers_never_probe_one_config_twice(tmp_path, new_postgres_url):
    url = new_postgres_url()
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    env = {**os.environ, "COLUMNS": "200"}
    subprocess.run([TUNER, "db", "upgrade", "--storage", url], check=True, env=env, capture_output=True, timeout=120)
    args = [
        TUNER,
        "search",
        "--budget",
        "100s",
        "--study",
        "shared",
        "--storage",
        url,
        "--space",
        str(space),
        "--device-memory",
        "160MiB",
        "--finalists",
        "1",
        "--seed",
    ]
    workers = [
        subprocess.Popen([*args, str(seed)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for seed in (1, 2)
    ]
    outs = [w.communicate(timeout=400) for w in workers]
    for w, (out, err) in zip(workers, outs, strict=False):
        assert w.returncode == 0, out[-2000:] + err[-2000:]

    from tuner.storage import Store

    store = Store(url)
    rows = store.probes("shared")
    measured = Counter((r.config_key, r.fidelity) for r in rows if r.fidelity != "inferred")
    assert measured and max(measured.values()) == 1, f"a config was probed twice: {measured}"
    per_trial = Counter(r.trial_number for r in rows if r.fidelity in ("short", "baseline", "inferred"))
    assert max(per_trial.values()) == 1, "a trial was recorded twice"
    runs = store.runs("shared")
    assert len(runs) == 2 and all(r.status == "finished" for r in runs)
    assert len({r.run_id for r in rows if r.fidelity != "inferred"}) >= 1
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trials = optuna.load_study(study_name="shared", storage=url).trials
    assert all(t.state.is_finished() for t in trials), "a RUNNING trial was left behind"
    # both workers answer the same best config
    best = [
        subprocess.run(
            [TUNER, "best", "--storage", url, "--study", "shared"], capture_output=True, text=True, env=env, timeout=120
        ).stdout
        for _ in range(2)
    ]
    assert best[0] == best[1] and '"micro_batch_size"' in best[0]
