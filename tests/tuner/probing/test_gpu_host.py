"""The GPU host's decisions (visible devices, world size, locks, GPU type, transient failures, exit statuses) on given
strings and numbers; the per-GPU lock, the cgroup counter and the collective preflight for real on this CPU host."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from trials.contract import EXIT_BUSY, EXIT_HOST_OOM, EXIT_KILLED, EXIT_OOM, ModelSpec
from tuner.errors import ConfigError
from tuner.probing import gpus
from tuner.probing.cgroup import cgroup_paths, oom_kills_between, parse_oom_kills, read_oom_kills
from tuner.probing.environment import hub_id, probe_env
from tuner.probing.preflight import failure_message, run_preflight
from tuner.probing.verdict import exit_status, is_transient, stderr_fallback


def test_visible_devices_as_cuda_reads_cuda_visible_devices() -> None:
    assert gpus.visible_devices(None, 8) == [str(i) for i in range(8)]
    assert gpus.visible_devices("", 8) == []
    assert gpus.visible_devices("2,3", 8) == ["2", "3"]
    assert gpus.visible_devices("0,9,1", 4) == ["0"]  # stops at the first invalid index
    assert gpus.visible_devices("1,1,2", 4) == ["1"]  # a repeat ends the list
    assert gpus.visible_devices("-1", 4) == []
    assert gpus.visible_devices("MIG-5c9d1f2e-aaaa", 1) == ["MIG-5c9d1f2e-aaaa"]
    assert gpus.visible_devices("GPU-a,GPU-b", 2) == ["GPU-a", "GPU-b"]


def test_world_size_above_the_visible_gpus_is_one_line_before_any_probe() -> None:
    with pytest.raises(
        ConfigError, match=r"--world-size 4 needs 4 GPUs but 2 are visible \(CUDA_VISIBLE_DEVICES '0,1'"
    ):
        gpus.check_world_size(4, gpus.visible_devices("0,1", 8), 8, "0,1")
    gpus.check_world_size(2, ["0", "1"], 8, "0,1")
    gpus.check_world_size(4, [], 0, None)  # a CPU host: ranks run on the emulated device


def test_each_probe_locks_the_gpus_its_ranks_use() -> None:
    assert gpus.lock_names(2, ["3", "1", "0"]) == ["gpu-index1", "gpu-index3"]
    assert gpus.lock_names(1, ["MIG-x/y"]) == ["gpu-MIG-x_y"]


def test_gpu_locks_are_keyed_by_the_gpu_not_by_its_visible_index() -> None:
    """Two workers naming one GPU differently (CUDA_VISIBLE_DEVICES=1 vs its UUID) take the same lock (issue 23,
    defect 9); NVML's UUID lookup is given (no GPU here)."""
    uuids = {0: "GPU-aaaa", 1: "GPU-bbbb"}
    assert gpus.lock_names(1, ["1"], uuids.__getitem__) == gpus.lock_names(1, ["GPU-bbbb"]) == ["gpu-GPU-bbbb"]
    assert gpus.lock_names(1, ["1"], lambda index: "") == ["gpu-index1"]  # NVML cannot say


def test_gpu_locks_live_in_one_host_wide_directory_every_worker_can_share(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert Path("/tmp/tuner-gpu-locks") == gpus.LOCK_DIR  # not $TMPDIR, which differs between workers
    locks = tmp_path / "locks"
    with gpus.gpu_locks(["gpu-GPU-bbbb"], timeout_s=1, lock_dir=locks) as held:
        assert held
    assert locks.stat().st_mode & 0o7777 == 0o1777  # sticky: nobody removes another's lock file
    assert (locks / "gpu-GPU-bbbb").stat().st_mode & 0o777 == 0o644  # others open it read-only to flock it
    (locks / "gpu-GPU-bbbb").chmod(0o444)  # another worker's flock needs no write access to the file
    with gpus.gpu_locks(["gpu-GPU-bbbb"], timeout_s=1, lock_dir=locks) as again:
        assert again
    (locks / "gpu-evil").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError), gpus.gpu_locks(["gpu-evil"], timeout_s=0.3, lock_dir=locks):
        pass


def test_a_second_holder_waits_for_the_gpu_lock_and_gives_up(tmp_path: Path) -> None:
    with gpus.gpu_locks(["gpu-0"], timeout_s=1, lock_dir=tmp_path) as first:
        assert first
        with gpus.gpu_locks(["gpu-1", "gpu-0"], timeout_s=0.3, lock_dir=tmp_path) as second:
            assert not second
        with gpus.gpu_locks(["gpu-1"], timeout_s=0.3, lock_dir=tmp_path) as other:
            assert other  # another GPU is free
    with gpus.gpu_locks(["gpu-0"], timeout_s=0.3, lock_dir=tmp_path) as again:
        assert again  # released with its holder


def test_a_worker_on_another_gpu_type_is_refused_unless_the_budget_is_given() -> None:
    stored = {"gpu_name": "NVIDIA H200", "gpu_capacity": 150_000_000_000}
    assert gpus.fingerprint_refusal(stored, "NVIDIA H200", False) is None
    line = gpus.fingerprint_refusal(stored, "NVIDIA A100-SXM4-40GB", False)
    assert line is not None and "NVIDIA A100-SXM4-40GB" in line and "NVIDIA H200" in line and "--device-memory" in line
    assert gpus.fingerprint_refusal(stored, "NVIDIA A100-SXM4-40GB", True) is None
    assert gpus.fingerprint_refusal({"gpu_name": ""}, "", False) is None  # CPU hosts
    assert gpus.fingerprint_refusal(None, "NVIDIA H200", False) is None  # nothing probed yet


def test_the_cgroup_oom_kill_counter(tmp_path: Path) -> None:
    assert parse_oom_kills("low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\noom_group_kill 0\n") == 2
    assert parse_oom_kills("oom_kill_disable 0\nunder_oom 0\noom_kill 7\n") == 7  # cgroup v1 memory.oom_control
    assert parse_oom_kills("oom_kill_disable 0\nunder_oom 0\n") is None  # an old v1 kernel: no counter
    paths = cgroup_paths("0::/user.slice/job\n", root=tmp_path)
    assert paths[0] == tmp_path / "user.slice/job/memory.events"
    v1 = cgroup_paths("4:memory:/docker/abc\n0::/\n", root=tmp_path)
    assert tmp_path / "memory/docker/abc/memory.oom_control" in v1
    assert oom_kills_between(3, 5) == 2 and oom_kills_between(None, 5) is None
    count = read_oom_kills()  # this host's own cgroup: a count, or None where none is readable
    assert count is None or count >= 0


def test_a_sigkill_is_a_host_oom_only_with_the_kernels_word() -> None:
    status, cause = exit_status(1, -signal.SIGKILL, "", oom_kills=1)
    assert status == "host-oom" and "OOM killer" in cause
    assert exit_status(1, -signal.SIGKILL, "", oom_kills=0)[0] == "killed"
    assert exit_status(1, -signal.SIGKILL, "", oom_kills=None)[0] == "killed"  # no counter: no evidence
    assert exit_status(0, EXIT_OOM, "", None)[0] == "oom"
    assert exit_status(0, EXIT_HOST_OOM, "", None)[0] == "host-oom"
    assert exit_status(0, EXIT_BUSY, "", None)[0] == "device-busy"
    assert exit_status(0, EXIT_KILLED, "", None)[0] == "killed"  # an interrupt the rank could not write down
    assert exit_status(0, -signal.SIGINT, "KeyboardInterrupt", None)[0] == "killed"  # Python's exit on one
    # the exit code wins over the stderr text: it is the rank's own word
    assert exit_status(0, EXIT_OOM, "Watchdog caught collective operation timeout", None)[0] == "oom"


def test_a_rank_that_died_inside_a_library_is_read_from_its_stderr_only_as_the_fallback() -> None:
    """No result, no reason record, no telling exit code: an abort (SIGABRT) or a crash inside a C++/CUDA library."""
    watchdog = "[E] ProcessGroupNCCL: Watchdog caught collective operation timeout: WorkNCCL(OpType=ALLREDUCE)"
    assert exit_status(0, -signal.SIGABRT, watchdog, None)[0] == "timeout"
    assert exit_status(0, -signal.SIGABRT, "CUDA out of memory. Tried to allocate 1 GiB", None)[0] == "oom"
    cublas = "terminate called after throwing an instance of 'c10::Error' what(): CUBLAS_STATUS_ALLOC_FAILED"
    assert exit_status(0, -signal.SIGABRT, cublas, None)[0] == "oom"
    status, cause = exit_status(0, -signal.SIGSEGV, "Segmentation fault", None)
    assert status == "error" and "signal 11" in cause and "Segmentation fault" in cause
    assert exit_status(0, 1, "Traceback ... KeyError", None)[0] == "error"
    for text in (
        "CUDA error: out of memory",
        "NCCL WARN Failed to CUDA calloc 4096 bytes",
        "Cuda failure 'out of memory'",
    ):
        assert stderr_fallback(text) == "oom"
    assert stderr_fallback("[rank1]:[E] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5)") == "timeout"
    assert stderr_fallback("Segmentation fault") is None


def test_transient_failures_are_retried_and_verdicts_are_not() -> None:
    """Typed: the status or the launch-fault flag a rank (or the runner's launch) set, never the cause text."""
    assert is_transient("killed", False)
    assert is_transient("device-busy", False)
    assert is_transient("error", True)  # a launch failure, or a rank forked from a process whose CUDA was initialised
    for verdict in ("oom", "host-oom", "ok", "timeout", "error"):
        assert not is_transient(verdict, False)


def test_only_hub_ids_are_looked_up_and_ranks_read_them_offline(tmp_path: Path) -> None:
    assert hub_id(ModelSpec(source="builtin:tiny-t5")) is None
    assert hub_id(ModelSpec(source=str(tmp_path))) is None
    assert hub_id(ModelSpec(source="google/flan-t5-large")) == "google/flan-t5-large"
    assert probe_env(1, base={})["NCCL_DEBUG"] == "WARN"
    assert probe_env(1, base={"NCCL_DEBUG": "INFO"})["NCCL_DEBUG"] == "INFO"


def test_the_preflight_failure_names_the_nccl_fixes() -> None:
    assert failure_message(2, False, [0, 0], ["", ""], 64 << 20) is None
    line = failure_message(2, True, [-9, -9], ["", "NCCL WARN Cuda failure"], 64 << 20)
    assert line is not None and "hung past 90 s" in line
    for fix in ("NCCL_P2P_DISABLE=1", "NCCL_NVLS_ENABLE=0", "/dev/shm (now 64 MiB"):
        assert fix in line
    assert "NCCL WARN Cuda failure" in line


@pytest.mark.slow
def test_the_preflight_runs_its_collective_on_every_rank(tmp_path: Path) -> None:
    assert run_preflight(2, probe_env(2), tmp_path, timeout_s=120) is None  # gloo here, NCCL on a GPU host


def test_the_preflight_sees_a_dead_later_rank_at_once_not_as_a_hang() -> None:
    """Rank 0 waits (in its collective), rank 1 died: before, only rank 0 was polled, so rank 1's exit was never seen
    and the preflight reported a hang at its timeout (issue 23, defect 8). Real processes."""
    import subprocess
    import time

    from tuner.probing.preflight import wait_ranks

    procs = [
        subprocess.Popen(["sleep", "60"], start_new_session=True),
        subprocess.Popen(["sh", "-c", "exit 1"], start_new_session=True),
    ]
    time.sleep(0.2)
    timed_out = wait_ranks(procs, time.monotonic() + 30)
    assert timed_out is False
    assert procs[1].returncode == 1 and procs[0].returncode == -signal.SIGKILL


def test_nccls_own_reason_reaches_the_cause(tmp_path: Path) -> None:
    """NCCL logs to stdout, which nobody reads; each rank's NCCL_DEBUG_FILE (verdict.nccl_log) is tailed into the
    cause beside its stderr."""
    from tuner.probing.verdict import nccl_log, said_tail

    err = tmp_path / "rank1.stderr"
    err.write_text("Traceback ...\nDistBackendError: NCCL error\n")
    nccl_log(err).write_text("h:1:2 [1] NCCL INFO Bootstrap\nh:1:2 [1] NCCL WARN Cuda failure 'out of memory'\n")
    said = said_tail(err)
    assert "DistBackendError" in said and "NCCL: h:1:2 [1] NCCL WARN Cuda failure 'out of memory'" in said
    assert stderr_fallback(said) == "oom"


def test_the_quick_start_caps_a_gpu_at_a_share_of_the_card_not_the_cpus_emulated_160_mib() -> None:
    """160 MiB plus a CUDA context outside the allocator is never stable: on a GPU host the quick start searches a
    2 GiB share of the card, where the largest buckets still run out of memory (issue 23, defect 12)."""
    assert gpus.quickstart_device_memory(0, []) == "160MiB"
    assert gpus.quickstart_device_memory(4, ["0", "1", "2", "3"]) == "2GiB"
    assert gpus.quickstart_device_memory(4, []) == "160MiB"  # CUDA_VISIBLE_DEVICES="": the CPU's emulated device
    script = (Path(__file__).resolve().parents[3] / "scripts" / "quickstart.sh").read_text()
    assert "quickstart_device_memory(physical_gpus(), host_visible_devices()[0])" in script


def test_a_lock_directory_of_another_user_is_used_only_when_sticky() -> None:
    """Issue 24 §6: the shared folder belonged to whoever made it first; unless it is sticky its owner could swap
    the lock files under another user's workers."""
    assert gpus.lock_dir_ok(0o40700, owner=1000, uid=1000)  # ours
    assert gpus.lock_dir_ok(0o41777, owner=0, uid=1000)  # another's, sticky like /tmp
    assert not gpus.lock_dir_ok(0o40777, owner=0, uid=1000)  # another's, not sticky: refused
