"""The tight variants of a recorded table (benchmarks/tight.py) and their replay: the same recorded probes on a smaller
device, every strategy replayed on them side by side. Structure only: no timing or efficiency thresholds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.matrix import main as matrix_main
from benchmarks.replay import main
from benchmarks.table import Table
from benchmarks.tight import OOM_MEASURE_FRACTION, config_peaks, quantile, repeat_peak, variant

TABLE = Path(__file__).resolve().parents[2] / "benchmarks" / "tables" / "tiny-1rank-s3.json"


@pytest.fixture(scope="module")
def table() -> Table:
    if not TABLE.exists():
        pytest.fail(f"recorded table {TABLE} is missing; record it with benchmarks/record.py (see BENCHMARKS.md)")
    return Table.load(TABLE)


def test_quantile_is_linear_between_order_statistics() -> None:
    assert quantile([10, 20, 30, 40, 50], 0.5) == 30
    assert quantile([10, 20], 0.35) == 14
    with pytest.raises(ValueError):
        quantile([], 0.5)


@pytest.mark.parametrize("name", ["q60", "q35"])
def test_a_tight_variant_is_the_recording_on_a_smaller_device(table: Table, name: str) -> None:
    tight = variant(table, name)
    cap = tight.device_memory
    assert cap == quantile(config_peaks(table.raw), {"q60": 0.60, "q35": 0.35}[name]) < table.device_memory
    assert tight.name == f"{table.name}@{name}" and set(tight.entries) == set(table.entries)
    for key, entry in table.entries.items():
        now = tight.entries[key]
        for before, after in zip(entry.repeats, now.repeats, strict=True):
            assert after["capacity"] == cap and after["result"]["capacity"] == cap
            if before["status"] == "ok" and repeat_peak(before) <= cap:  # still runs, same speed and peak
                assert after["status"] == "ok" and after["samples_per_s"] == before["samples_per_s"]
                assert after["probe_seconds"] == before["probe_seconds"]
            elif before["status"] == "ok":  # its peak passes the smaller device: an OOM, charged part of the probe
                setup = before["setup_s"] or 0.0
                assert after["status"] == "oom" and after["result"]["status"] == "oom"
                assert after["samples_per_s"] is None and after["result"]["steps"] is None
                charged = setup + OOM_MEASURE_FRACTION * (before["probe_seconds"] - setup)
                assert after["probe_seconds"] == pytest.approx(charged)
                assert after["probe_seconds"] < before["probe_seconds"]
            else:
                assert after["status"] == before["status"] and after["probe_seconds"] == before["probe_seconds"]
            if after["status"] == "oom":  # what a CUDA OOM tells: no refused size
                assert all(r["oom_need"] is None for r in after["result"]["ranks"])
        # stable now: every repeat under the headroom line of the smaller device
        peak = max(repeat_peak(r) for r in entry.repeats)
        assert now.stable == (entry.stable and peak <= tight.headroom * cap)
    assert 0 < sum(e.stable for e in tight.entries.values()) < sum(e.stable for e in table.entries.values())


def test_the_tight_variants_replay_side_by_side(table: Table, tmp_path: Path) -> None:
    ours, peers, out = tmp_path / "ours.json", tmp_path / "peers.json", tmp_path / "matrix.md"
    common = [str(TABLE), "--seeds", "2", "--heldout", "100:1", "--variants", "full,q60,q35"]
    assert main([*common, "--strategies", "ours", "--json", str(ours), "--matrix", str(out)]) == 0
    assert main([*common, "--strategies", "grid,hf-x0.5", "--json", str(peers)]) == 0
    data = json.loads(ours.read_text())
    assert list(data) == [table.name, f"{table.name}@q60", f"{table.name}@q35"]
    for name, part in data.items():
        assert part["table"]["variant"] == (name.partition("@")[2] or "full")
        for results, runs in ((part["results"], 2), (part["heldout"], 1)):
            r = results["ours"]
            assert r["runs"] == runs and r["unstable_picks"] == 0 and r["no_pick"] == 0 and r["final"] > 0.0
            assert r["probes"] >= 1
    lines = out.read_text().splitlines()
    assert len(lines) == 2 + 3 and all(line.count("|") == lines[0].count("|") for line in lines)
    assert matrix_main([str(ours), str(peers)]) == 0
    assert matrix_main(["--pivot", str(ours), str(peers)]) == 0
    assert matrix_main([str(tmp_path / "missing.json")]) == 2
    assert main([str(TABLE), "--variants", "q50"]) == 2  # an unknown variant: one line, exit 2
