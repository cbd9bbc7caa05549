from tuner.selection import best_stable, candidates, is_stable

MiB = 2**20


def row(key, objective, *, fidelity="short", stable=True, status="ok", peak=10 * MiB, id=0, micro=1):
    return {
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
