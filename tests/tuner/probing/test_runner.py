"""Real probes through tuner.probing.runner.run_probe on CPU: real torch, a real DeepSpeed engine, real subprocesses."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from trials.contract import Knobs, ModelSpec, ProbeResult
from tuner.probing.config import probe_config
from tuner.probing.runner import run_probe

pytestmark = pytest.mark.slow

TINY = ModelSpec(source="builtin:tiny-t5")


def _pids_mentioning(text: str) -> list[int]:
    """Live processes whose command line mentions ``text`` (a probe's work dir): a /proc scan, no psutil."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmd and state != b"Z":
            found.append(int(entry))
    return found


def _assert_no_survivors(work: Path) -> None:
    """Every rank's process group is gone (the runner wrote each rank's pid, which is also its group id)."""
    pids = [int(p.read_text()) for p in work.glob("rank*.pid")]
    assert pids, "the runner recorded no rank pids"
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)
    assert not _pids_mentioning(str(work))


@pytest.fixture(params=["spawn", "forkserver"])
def launcher(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _assert_ok(result: ProbeResult) -> None:
    assert result.status == "ok", result.cause
    assert result.samples_per_s is not None and result.samples_per_s > 0
    assert result.steps is not None and result.steps.cycle_s > 0
    assert result.peak_allocated is not None and result.peak_allocated > 0


def test_one_rank_plain_torch_probe(tmp_path: Path, launcher: str) -> None:
    cfg = probe_config(
        model=TINY,
        knobs=Knobs(micro_batch_size=4, max_length=32, engine="torch"),
        gradient_accumulation_steps=4,
        measure_steps=4,
        timeout_s=240,
    )
    result = run_probe(cfg, tmp_path, launcher=launcher)
    _assert_ok(result)
    steps = result.steps
    assert steps is not None
    # the real cycle of 4 micro-steps is composed from timed plain micro-steps and a timed optimizer step
    assert steps.cycle_s == pytest.approx(3 * steps.micro_mean_s + steps.optimizer_step_s)
    assert result.samples_per_s == pytest.approx(16 / steps.cycle_s)
    assert result.tokens_per_s == pytest.approx(result.samples_per_s * 32)
    # peak includes fp32 params + grads + AdamW's two moments: at least 4x the parameter bytes
    params = 263_168 * 4
    assert result.peak_allocated is not None and result.peak_allocated >= 4 * params
    assert [r.rank for r in result.ranks] == [0]
    assert result.versions["torch"] and result.versions["transformers"]
    assert result.fingerprint["cpu_cores"] == os.cpu_count()
    assert result.setup_s is not None and 0 < result.setup_s < result.wall_s
    assert (tmp_path / "result.json").exists()
    _assert_no_survivors(tmp_path)


def test_two_rank_deepspeed_zero2_overlap_comm_custom_buckets(tmp_path: Path) -> None:
    knobs = Knobs(
        micro_batch_size=2,
        max_length=32,
        zero_stage=2,
        overlap_comm=True,
        contiguous_gradients=True,
        allgather_bucket_size=50_000,
        reduce_bucket_size=50_000,
    )
    cfg = probe_config(
        model=TINY, knobs=knobs, world_size=2, gradient_accumulation_steps=2, measure_steps=2, timeout_s=300
    )
    result = run_probe(cfg, tmp_path, launcher="forkserver")
    _assert_ok(result)
    assert sorted(r.rank for r in result.ranks) == [0, 1]
    assert all(r.peak_allocated > 0 for r in result.ranks)
    assert result.samples_per_s == pytest.approx(8 / result.steps.cycle_s)  # type: ignore[union-attr]
    assert result.versions["deepspeed"]
    _assert_no_survivors(tmp_path)


def test_local_save_pretrained_dir_with_eval_and_generate(tmp_path: Path) -> None:
    from transformers import T5Config, T5ForConditionalGeneration

    model_dir = tmp_path / "tiny-model"
    config = T5Config(
        vocab_size=300,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=1,
        num_decoder_layers=1,
        num_heads=4,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )
    T5ForConditionalGeneration(config).save_pretrained(model_dir)
    knobs = Knobs(micro_batch_size=2, max_length=16, engine="torch", eval_batch_size=4, generate=True)
    cfg = probe_config(model=ModelSpec(source=str(model_dir)), knobs=knobs, timeout_s=240)
    _assert_ok(run_probe(cfg, tmp_path / "work"))


def test_too_small_device_memory_is_oom(tmp_path: Path) -> None:
    cfg = probe_config(
        model=TINY,
        knobs=Knobs(micro_batch_size=8, max_length=128, engine="torch"),
        device_memory=8_000_000,
        timeout_s=240,
    )
    result = run_probe(cfg, tmp_path)
    assert result.status == "oom", result.cause
    assert "out of memory" in (result.cause or "")
    assert result.capacity == 8_000_000
    assert result.samples_per_s is None
    assert result.oom_need is not None and result.oom_need > 8_000_000  # what the refused allocation asked for


def test_two_rank_oom_ends_the_whole_group(tmp_path: Path) -> None:
    cfg = probe_config(
        model=TINY,
        knobs=Knobs(micro_batch_size=8, max_length=128, engine="torch"),
        world_size=2,
        device_memory=8_000_000,
        timeout_s=240,
    )
    result = run_probe(cfg, tmp_path, launcher="spawn")
    assert result.status == "oom", result.cause
    _assert_no_survivors(tmp_path)


def test_error_probe_reports_its_message(tmp_path: Path) -> None:
    cfg = probe_config(
        model=ModelSpec(source="builtin:no-such-preset"), knobs=Knobs(micro_batch_size=1, max_length=8), timeout_s=120
    )
    result = run_probe(cfg, tmp_path)
    assert result.status == "error"
    assert result.cause is not None and "unknown built-in model 'builtin:no-such-preset'" in result.cause


def test_timeout_kills_every_process_of_the_probe(tmp_path: Path, launcher: str) -> None:
    cfg = probe_config(
        model=TINY, knobs=Knobs(micro_batch_size=1, max_length=8, engine="torch"), measure_steps=10**7, timeout_s=4
    )
    result = run_probe(cfg, tmp_path, launcher=launcher)
    assert result.status == "timeout"
    assert "timeout" in (result.cause or "")
    assert result.wall_s < 60
    _assert_no_survivors(tmp_path)


def test_an_outside_sigkill_is_killed_not_oom_and_is_retried_once(tmp_path: Path, launcher: str) -> None:
    """A SIGKILL with no OOM kill in the memory cgroup proves nothing about memory: "killed", run once more."""
    cfg = probe_config(
        model=TINY, knobs=Knobs(micro_batch_size=1, max_length=8, engine="torch"), measure_steps=10**7, timeout_s=120
    )
    box: dict[str, ProbeResult] = {}
    worker = threading.Thread(target=lambda: box.setdefault("r", run_probe(cfg, tmp_path, launcher=launcher)))
    worker.start()
    pid_file = tmp_path / "rank0.pid"
    killed: set[int] = set()
    deadline = time.monotonic() + 240
    while len(killed) < 2 and time.monotonic() < deadline and worker.is_alive():
        pid = int(pid_file.read_text()) if pid_file.exists() else None
        if pid is not None and pid not in killed:
            time.sleep(0.5)
            os.kill(pid, signal.SIGKILL)  # what an operator's kill -9 (or a preempting scheduler) does
            killed.add(pid)
        time.sleep(0.05)
    worker.join(120)
    assert len(killed) == 2, "the killed probe was not launched a second time"
    result = box["r"]
    assert result.status == "killed" and result.attempts == 2
    assert "SIGKILL" in (result.cause or "") and "no verdict" in (result.cause or "")
    _assert_no_survivors(tmp_path)


def test_offload_takes_optimizer_state_off_the_emulated_device(tmp_path: Path) -> None:
    """ZeRO-1 with and without CPU offload (DeepSpeedCPUAdam; the op compiles once, outside the probe's clock)."""

    def peak(offload: bool) -> int:
        knobs = Knobs(
            micro_batch_size=2,
            max_length=32,
            zero_stage=1,
            offload_optimizer=offload,
            reduce_bucket_size=50_000,
            allgather_bucket_size=50_000,
        )
        cfg = probe_config(model=TINY, knobs=knobs, gradient_accumulation_steps=2, measure_steps=2, timeout_s=300)
        result = run_probe(cfg, tmp_path / f"offload-{offload}")
        _assert_ok(result)
        assert result.peak_allocated is not None
        return result.peak_allocated

    adam_state = 2 * 4 * 263_168  # exp_avg + exp_avg_sq in fp32
    # offload moves AdamW's state (and the fp32 master partition) to the host; DeepSpeed adds a small device-side
    # staging buffer for the gradient copies, so the saving is most, not all, of the state
    assert peak(True) < peak(False) - adam_state // 2


def test_zero3_bf16_checkpointing_smoke(tmp_path: Path) -> None:
    knobs = Knobs(micro_batch_size=2, max_length=16, zero_stage=3, precision="bf16", gradient_checkpointing=True)
    cfg = probe_config(model=TINY, knobs=knobs, warmup_steps=2, measure_steps=1, timeout_s=300)
    _assert_ok(run_probe(cfg, tmp_path))


def test_setup_phases_are_reported(tmp_path: Path) -> None:
    cfg = probe_config(model=TINY, knobs=Knobs(micro_batch_size=1, max_length=8, engine="torch"), timeout_s=120)
    result = run_probe(cfg, tmp_path, launcher="forkserver")
    _assert_ok(result)
    assert set(result.setup_phases) >= {"start", "model", "engine"}
    assert result.setup_s is not None
    assert sum(result.setup_phases.values()) <= result.setup_s + 1e-6


def test_runner_killed_leaves_no_fork_server_nor_probe(tmp_path: Path) -> None:
    """kill -9 of the process running the search: the fork server sees its stdin close and kills the probe's group."""
    import subprocess
    import sys

    script = (
        "import sys; from pathlib import Path; from trials.contract import Knobs, ProbeConfig; "
        "from tuner.probing.runner import run_probe; "
        "run_probe(ProbeConfig(knobs=Knobs(micro_batch_size=1, max_length=8, engine='torch'), measure_steps=10**7, "
        "timeout_s=600), Path(sys.argv[1]), launcher='forkserver')"
    )
    driver = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], start_new_session=True)
    pid_file = tmp_path / "rank0.pid"
    deadline = time.monotonic() + 180
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pid_file.exists(), "the probe never started"
    child = int(pid_file.read_text())
    with open(f"/proc/{child}/stat", "rb") as fh:
        server = int(fh.read().rsplit(b")", 1)[1].split()[1])  # the forked rank's parent: the fork server
    assert server != driver.pid
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (os.path.exists(f"/proc/{server}") or os.path.exists(f"/proc/{child}")):
        time.sleep(0.1)
    _assert_no_survivors(tmp_path)
    with pytest.raises(ProcessLookupError):
        os.kill(server, 0)


def test_allocator_env_sets_both_variables_from_the_knob_and_nothing_when_unset() -> None:
    from trials.contract import alloc_conf_in_force, allocator_env

    assert allocator_env("expandable_segments:True") == {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "PYTORCH_ALLOC_CONF": "expandable_segments:True",
    }
    assert allocator_env(None) == {} and allocator_env("") == {}
    assert alloc_conf_in_force({"PYTORCH_ALLOC_CONF": "b", "PYTORCH_CUDA_ALLOC_CONF": "a"}) == "a"  # torch's order
    assert alloc_conf_in_force({"PYTORCH_ALLOC_CONF": "b"}) == "b" and alloc_conf_in_force({}) is None


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["forkserver", "spawn"])
def test_alloc_conf_reaches_the_rank_and_an_inherited_one_is_recorded(launcher, monkeypatch) -> None:
    knob = run_probe(
        probe_config(knobs=Knobs(micro_batch_size=2, max_length=16, engine="torch", alloc_conf="max_split_size_mb:64")),
        launcher=launcher,
    )
    assert knob.status == "ok", knob.cause
    assert knob.fingerprint["alloc_conf"] == "max_split_size_mb:64"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # the user's shell
    shell = run_probe(probe_config(knobs=Knobs(micro_batch_size=2, max_length=16, engine="torch")), launcher=launcher)
    assert shell.status == "ok", shell.cause
    assert shell.fingerprint["alloc_conf"] == "expandable_segments:True"


@pytest.mark.slow
def test_a_probe_runs_the_jobs_label_length_and_eval_generate_with_beams() -> None:
    from trials.contract import JobSettings

    knobs = Knobs(micro_batch_size=2, max_length=32, engine="torch", eval_batch_size=4, generate=True)
    short = run_probe(probe_config(knobs=knobs, job=JobSettings(max_target_length=4), device_memory=64 << 20))
    assert short.status == "ok", short.cause
    long = run_probe(
        probe_config(
            knobs=knobs,
            job=JobSettings(max_target_length=32, generation_max_length=32, num_beams=4),
            device_memory=64 << 20,
        )
    )
    assert long.status == "ok", long.cause
    # longer labels and a 4-beam generate of 32 tokens need more memory than 4-token labels and a 4-token greedy one
    assert long.peak_allocated is not None and short.peak_allocated is not None
    assert long.peak_allocated > short.peak_allocated
