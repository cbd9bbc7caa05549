"""A probe's verdict from its ranks: each rank's status from its own account, then one ProbeResult.

One rank's status, the first evidence that exists:

1. its result file (trials.contract.RankResult): the rank's own account;
2. its reason record (trials.contract.RankReason, written by trials.last_words): a rank that could not write its
   result (an exception past its handler, an interrupt, a result it could not write, a side thread's failure) said
   why, typed;
3. stopped by us: "timeout" at the probe's timeout; no status of its own when a peer failed first;
4. its exit code: SIGKILL is "host-oom" only with the kernel's word for it (the memory cgroup's OOM kills during the
   probe, tuner.probing.cgroup), else "killed" (an outside kill); SIGINT (Python's exit after an interrupt) and
   EXIT_KILLED are "killed"; EXIT_OOM / EXIT_TIMEOUT / EXIT_HOST_OOM / EXIT_BUSY their class;
5. the documented exception, for a rank that could say nothing and whose exit code names no class: a process that died
   inside a C++/CUDA library before Python saw it (an abort from the NCCL watchdog, std::terminate on a library
   thread after a CUDA OOM, a segfault) writes no record, so its stderr tail is read for the few texts that prove a
   class (``stderr_fallback``); else "error".

DESIGN's rule, status from exit codes and result files, never from stderr text, holds but for step 5, which no rank
can avoid. Whether a failure is transient (no verdict on the config: run once more) is typed too: the status
(Status.transient: "killed", "device-busy") or the rank's own ``launch_fault`` flag, never the cause text.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trials.contract import ProbeConfig, ProbeNode, ProbeResult, RankResult, Status
from tuner.probing.accounts import RankAccount
from tuner.probing.batches import drawn_tokens_per_sample
from tuner.probing.ranks import Rank

STDERR_TAIL_LINES = 8


def telling_exit(code: int | None) -> Status | None:
    """The status a rank's exit code carries (Status.exit_code; -SIGINT: Python's own exit after an uncaught
    interrupt, "killed"), or None when the code tells nothing beyond "error" (0 or EXIT_ERROR without a result file,
    a traceback's 1, anything else)."""
    if code is None:
        return None
    if code == -signal.SIGINT:
        return Status.KILLED
    status = Status.of_exit_code(code)
    return status if status not in (None, Status.OK, Status.ERROR) else None


# The fallback only (step 5 of the module doc): what a rank's stderr says when it died inside a library without a
# record or a telling exit code. Lower-case substrings -> the status they prove.
STDERR_FALLBACK: tuple[tuple[str, Status], ...] = (
    ("watchdog caught collective operation timeout", Status.TIMEOUT),
    ("cublas_status_alloc_failed", Status.OOM),
    ("cuda out of memory", Status.OOM),
    ("cuda error: out of memory", Status.OOM),
    ("failed to cuda calloc", Status.OOM),
    ("cuda failure 'out of memory'", Status.OOM),
)


def stderr_fallback(text: str) -> Status | None:
    """The status a dead rank's stderr proves (``STDERR_FALLBACK``), or None: read only for a rank that left no result,
    no reason record and no telling exit code (the module doc's step 5)."""
    low = text.lower()
    return next((status for needle, status in STDERR_FALLBACK if needle in low), None)


def tail(path: Path, lines: int = STDERR_TAIL_LINES) -> str:
    """The last lines of a rank's stderr, joined on one line (for a person reading the cause)."""
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text[-lines:] if line.strip())


def nccl_log(stderr: Path) -> Path:
    """Where a rank's NCCL writes its log (NCCL_DEBUG_FILE, set per rank by tuner.probing.ranks): NCCL logs to stdout,
    which nobody reads, so its reason for a failure or a hang would otherwise never reach a cause."""
    return stderr.with_suffix(".nccl")


def said_tail(stderr: Path) -> str:
    """What a rank said last: its stderr tail, and NCCL's last warnings when it logged any."""
    text = tail(stderr)
    try:
        warns = [ln.strip() for ln in nccl_log(stderr).read_text(errors="replace").splitlines() if "NCCL WARN" in ln]
    except OSError:
        warns = []
    nccl = " | ".join(warns[-2:])
    return " | ".join(part for part in (text, f"NCCL: {nccl}" if nccl else "") if part)


def _sigkill(rank: int, oom_kills: int | None) -> tuple[Status, str]:
    if oom_kills:
        return Status.HOST_OOM, (
            f"rank {rank} was killed by the kernel's OOM killer (host out of memory: the memory cgroup counted "
            f"{oom_kills} OOM kill(s) during the probe)"
        )
    seen = "no OOM kill in the memory cgroup" if oom_kills == 0 else "no cgroup OOM counter to tell an OOM kill"
    return Status.KILLED, f"rank {rank} was killed by SIGKILL from outside ({seen}): no verdict on its memory"


def exit_status(rank: int, code: int | None, stderr_tail: str, oom_kills: int | None) -> tuple[Status, str]:
    """(status, cause) of a rank that ended without a result file or a reason record and was not stopped by us (pure):
    steps 4 and 5 of the module doc."""
    if code == -signal.SIGKILL:
        return _sigkill(rank, oom_kills)
    status = telling_exit(code) or stderr_fallback(stderr_tail) or Status.ERROR
    detail = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
    said = f" [stderr: {stderr_tail}]" if stderr_tail else ""
    return status, f"rank {rank} ended with {detail} and no result file{said}"


def _with_stderr(status: Status, cause: str | None, r: Rank) -> str | None:
    """An error's cause with the rank's stderr tail (for a person; the status is already decided)."""
    if status != Status.ERROR:
        return cause
    said = said_tail(r.err)
    return f"{cause} [stderr: {said}]" if said and cause else (cause or said or None)


def rank_status(r: Rank, timed_out: bool, oom_kills: int | None) -> tuple[Status | None, str | None]:
    """(status, cause) of one rank (the module doc's order); (None, None) for a rank we stopped after a peer failed."""
    res = r.read()
    if res is not None:
        return res.status, _with_stderr(res.status, res.cause, r)
    reason = r.reason()
    if reason is not None:
        return reason.status, _with_stderr(reason.status, f"rank {r.rank}: {reason.cause}", r)
    if r.killed_by_us:
        return (Status.TIMEOUT, None) if timed_out else (None, None)
    return exit_status(r.rank, r.proc.returncode, said_tail(r.err), oom_kills)


def account(r: Rank, timed_out: bool, oom_kills: int | None = None, node: str = "") -> RankAccount:
    """One rank's account (``rank_status`` and what it said), keyed by ``node`` and its local rank."""
    status, cause = rank_status(r, timed_out, oom_kills)
    said = r.read() or r.reason()
    return RankAccount(
        node=node,
        local_rank=r.local,
        rank=r.rank,
        status=status,
        cause=cause,
        result=r.read(),
        phase=said.phase if said is not None else None,
        said=said_tail(r.err),
        launch_fault=r.launch_fault,
    )


def merge(
    config: ProbeConfig, ranks: Sequence[Rank], timed_out: bool, wall_s: float, oom_kills: int | None = None
) -> ProbeResult:
    """The probe's result from its ranks on this host (``merge_accounts`` of their accounts)."""
    return merge_accounts(config, [account(r, timed_out, oom_kills) for r in ranks], timed_out, wall_s)


def merge_accounts(
    config: ProbeConfig,
    accounts: Sequence[RankAccount],
    timed_out: bool,
    wall_s: float,
    nodes: Sequence[ProbeNode] = (),
) -> ProbeResult:
    """The probe's result from every rank's account (of one host, or of every node: ``nodes``): the most telling
    failure names it (Status.severity, then the lowest rank), else rank 0's steps. ``timed_out``: the probe (any
    node's part) passed its timeout."""
    accounts = sorted(accounts, key=lambda a: (a.order, a.node, a.local_rank))
    results = [a.result for a in accounts]
    memories = [res.memory for res in results if res is not None and res.memory is not None]
    first = next((res for res in results if res is not None), None)
    timed = [res for res in results if res is not None and res.setup_s is not None]
    slowest = max(timed, key=lambda res: res.setup_s or 0.0, default=None)
    failures = [a for a in accounts if a.status not in (None, Status.OK)]
    common: dict[str, Any] = dict(
        ranks=memories,
        capacity=next((m.capacity for m in memories if m.capacity), None),
        versions=first.versions if first else {},
        fingerprint=first.fingerprint if first else {},
        wall_s=wall_s,
        setup_s=slowest.setup_s if slowest else None,
        setup_phases=slowest.setup_phases if slowest else {},
        run_phases=slowest.run_phases if slowest else {},
        sharded=_sharded([res for res in results if res is not None]),
        nodes=list(nodes),
    )
    if timed_out and all(a.status == Status.TIMEOUT for a in failures):
        nccl = next((a.said for a in accounts if "NCCL:" in a.said), "")
        line = f"probe passed its {config.timeout_s:g} s timeout; all ranks were killed"
        return ProbeResult(status=Status.TIMEOUT, cause=line + (f" [{nccl}]" if nccl else ""), **common)
    if failures:
        worst = max(failures, key=lambda a: (Status(a.status).severity, -a.order))
        cause = worst.cause or f"{worst.label}: {worst.status}"
        if worst.node:  # across nodes: where it happened (c10d's global ranks are join order)
            cause = f"on node {worst.node}, local rank {worst.local_rank}: {cause}"
        return ProbeResult(status=Status(worst.status), cause=cause, phase=worst.phase, **common)
    if any(a.status is None for a in accounts) or not results or results[0] is None or results[0].steps is None:
        return ProbeResult(status=Status.ERROR, cause="probe ended without results from every rank", **common)
    if config.batches is not None:
        return _drawn(config, [res for res in results if res is not None], common)
    steps = results[0].steps
    samples = config.global_batch / steps.cycle_s if steps.cycle_s > 0 else None
    return ProbeResult(
        status=Status.OK,
        samples_per_s=samples,
        tokens_per_s=samples * config.knobs.max_length if samples else None,
        steps=steps,
        **common,
    )


def _sharded(results: Sequence[RankResult]) -> bool | None:
    """FSDP2: True when every rank that said so held only shards; None when no rank says (another engine)."""
    said = [res.sharded for res in results if res.sharded is not None]
    return all(said) if said else None


def _drawn(config: ProbeConfig, results: Sequence[RankResult], common: dict[str, Any]) -> ProbeResult:
    """A probe timed on batches drawn from the data: each rank ran its own, so a step takes the slowest rank's time
    (the gradient all-reduce waits for it); tokens/s counts the drawn samples' real input tokens, and the padded
    ones beside them."""
    assert config.batches is not None
    steps = max((res.steps for res in results if res.steps is not None), key=lambda s: s.cycle_s)
    samples = config.global_batch / steps.cycle_s if steps.cycle_s > 0 else None
    real, padded = drawn_tokens_per_sample(config.batches, config.knobs.micro_batch_size)
    return ProbeResult(
        status=Status.OK,
        samples_per_s=samples,
        tokens_per_s=samples * real if samples else None,
        batches="drawn",
        padded_tokens_per_s=samples * padded if samples else None,
        memory_shape=results[0].memory_shape,
        timed_shapes=[res.timed_shapes for res in results],
        steps=steps,
        **common,
    )


def launch_fault(ranks: Sequence[Rank]) -> bool:
    """Whether a rank said its failure was the launch's (a forked rank that could not use CUDA)."""
    return any(r.launch_fault for r in ranks)


def is_transient(status: Status, launch_fault: bool) -> bool:
    """A failure that says nothing about the config (retried once): an outside kill, a busy GPU, a launch or
    environment failure (the fork server, the hub lookup, a forked rank that could not use CUDA)."""
    return launch_fault or Status(status).transient


__all__ = [
    "account",
    "exit_status",
    "is_transient",
    "launch_fault",
    "merge",
    "merge_accounts",
    "rank_status",
    "stderr_fallback",
    "tail",
    "telling_exit",
]
