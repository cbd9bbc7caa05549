import math

import pytest

from tuner.records import ProbeRow, is_stable
from tuner.search.selection import REPEAT_NOISE, baseline_row, best_stable, candidates, repeat_noise

MiB = 2**20


def row(key, objective, *, fidelity="short", stable=True, status="ok", peak=10 * MiB, id=0, micro=1):
    return ProbeRow.from_record(
        {
            "result": {},  # a measured ok row has its result (ProbeRow's invariant)
            "id": id,
            "config_key": key,
            "fidelity": fidelity,
            "status": status,
            "stable": stable,
            "objective": objective,
            "samples_per_s": objective,
            "peak_allocated": peak,
            "capacity": 100 * MiB,
            "knobs": {"micro_batch_size": micro, "max_length": 8},
            "config": {"world_size": 1, "gradient_accumulation_steps": 1},
            "trial_number": id,
        }
    )


def test_is_stable_needs_ok_headroom_and_no_retries():
    assert is_stable("ok", 80 * MiB, 100 * MiB, 0.9, 0)
    assert not is_stable("ok", 95 * MiB, 100 * MiB, 0.9, 0)
    assert not is_stable("ok", 80 * MiB, 100 * MiB, 0.9, 3)
    assert not is_stable("oom", 10, 100, 0.9, 0)
    assert not is_stable("ok", None, 100, 0.9, 0)
    assert is_stable("ok", 10, None, 0.9, None)  # capacity unknown: only the status and retries decide


def test_best_is_the_highest_stable_objective():
    rows = [row("a", 5.0, id=1), row("b", 9.0, stable=False, id=2), row("c", 7.0, id=3)]
    assert best_stable(rows).config_key == "c"


def test_confirmed_beats_unconfirmed_and_uses_a_lower_bound():
    rows = [
        row("a", 10.0, id=1),
        row("b", 8.0, id=2),
        row("b", 7.0, fidelity="confirm", id=3),
        row("b", 9.0, fidelity="confirm", id=4),
    ]
    best = best_stable(rows)
    assert best.config_key == "b" and best.confirmed and best.measurements == 3
    assert best.objective <= 8.0  # min(median, mean - std)


def test_one_unstable_measurement_disqualifies_a_config():
    rows = [row("a", 10.0, id=1), row("a", 11.0, fidelity="confirm", stable=False, id=2), row("b", 3.0, id=3)]
    assert best_stable(rows).config_key == "b"


def test_inferred_rows_and_empty_input():
    assert best_stable([]) is None
    assert best_stable([row("x", None, fidelity="inferred", status="inferred-oom", stable=False)]) is None
    assert [c.config_key for c in candidates([row("a", 1.0, id=1), row("b", 2.0, id=2)])] == ["b", "a"]


def _noisy_study(spread: float) -> list[dict]:
    """Plain configs (micro 2, 4, 8) at ~100 and checkpointed ones at ~70, each measured twice with repeats that differ
    by ``spread``; and one checkpointed config (micro 16) measured once at 104."""
    rows, n = [], 0
    for micro, base, ckpt in (
        (2, 100.0, False),
        (4, 101.0, False),
        (8, 100.0, False),
        (2, 70.0, True),
        (4, 71.0, True),
        (8, 70.0, True),
    ):
        for sign in (1, -1):
            n += 1
            r = row(f"{micro}-{ckpt}", base * (1 + sign * spread / 2), id=n, micro=micro)
            r.knobs["gradient_checkpointing"] = ckpt
            rows.append(r)
    lucky = row("16-True", 104.0, id=n + 1, micro=16)
    lucky.knobs["gradient_checkpointing"] = True
    return [*rows, lucky]


def test_a_lucky_probe_does_not_outrank_what_the_other_probes_say_when_repeats_are_noisy():
    # repeats of one config differ by 30% (a shared CPU): 104 from one probe of a config family measured at ~70 is
    # far more likely noise than a real 4% gain
    found = candidates(_noisy_study(spread=0.3))
    assert found[0].config_key in {"2-False", "4-False", "8-False"}
    lucky = next(c for c in found if c.config_key == "16-True")
    assert lucky.objective == 104.0  # the measured throughput is still what the candidate reports


def test_precise_repeats_let_a_single_measurement_decide():
    # repeats agree within 0.5% (a GPU): the 4% faster measurement is real
    assert candidates(_noisy_study(spread=0.005))[0].config_key == "16-True"


def test_repeat_noise_is_pooled_over_repeated_configs_with_a_prior():
    assert repeat_noise([]) == pytest.approx(REPEAT_NOISE)  # no repeats: the prior guess
    assert repeat_noise([[math.log(100.0)], [math.log(50.0)]]) == pytest.approx(
        REPEAT_NOISE
    )  # single probes say nothing
    noisy = [[math.log(100.0), math.log(140.0)]] * 20
    assert repeat_noise(noisy) == pytest.approx(math.log(1.4) / math.sqrt(2), rel=0.05)


def test_the_baseline_row_is_the_first_stored():
    """A second baseline row (a worker presumed dead replays its journal after another re-probed the baseline) does
    not replace the one the search acted on: every face names the first stored."""
    first = row("base", 5.0, fidelity="baseline", id=1)
    later = row("base", 6.0, fidelity="baseline", id=3)
    rows = [row("a", 9.0, id=0), first, row("b", 7.0, id=2), later]
    assert baseline_row(rows) is first
    assert baseline_row([rows[0], rows[2]]) is None
