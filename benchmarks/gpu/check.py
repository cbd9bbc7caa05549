"""The GPU check's driver (issue 41): every GPU step in order, each under its own time box inside a hard deadline
computed from what is left (benchmarks.gpu.plan), the CPU traces beside them at the lowest priority, and the evidence
under $OUT as soon as each piece exists (benchmarks.gpu.evidence). A step that fails or runs out of its box says so
in one line and the next one runs; the check ends within its deadline whatever fails.

    benchmarks/gpu_check.sh        (PYTHON, KIT_SITE, DRY_RUN, OUT, GPU_CHECK_*: see that script)

Standard library only until the kit step has put the tuner's dependencies on the path of the steps' processes."""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.gpu import commands as cmd
from benchmarks.gpu import evidence as ev
from benchmarks.gpu import plan
from benchmarks.gpu.boxed import Background, Ran, run_boxed
from benchmarks.gpu.report import Report
from benchmarks.gpu.verdict import Check as Checked

TRACE_WAIT_S = 45.0  # what the CPU traces are given after the last GPU step, within the deadline
NOISY = ("search", "crash", "trainer")  # steps whose own output goes to the log only


class Check:
    def __init__(self, config: plan.CheckConfig, paths: cmd.Paths, out: Path, py: str, env: dict[str, str]) -> None:
        self.config, self.paths, self.py = config, paths, py
        self.start = time.monotonic()
        self.deadline = self.start + config.deadline_s
        self.env = env
        self.evidence = ev.Evidence(out)
        self.report = Report(self.evidence, paths.work / ev.LOG)
        self.background: dict[str, Background] = {}
        self.facts: dict[str, object] = {}
        self.failed: list[str] = []
        self.trace_args: dict[str, list[str]] = {}
        self.trace_modules: dict[str, str] = {}

    # -- the clock --------------------------------------------------------------------------------------------------
    def left(self) -> float:
        return self.deadline - time.monotonic()

    def box(self, name: str) -> float:
        step = self.config.step(name)
        box = plan.box_for(step, self.left(), plan.reserve_after(self.config.steps, name), self.config.forces)
        if box <= 0:
            self.verdict(name, "SKIPPED", 0.0, step.box_s, f"{self.left():.0f} s left of the deadline")
        return box

    def verdict(self, name: str, status: str, seconds: float, box: float, why: str) -> None:
        if status in ("FAIL", "TIMEOUT", "SKIPPED") and name not in self.failed:
            self.failed.append(name)
        self.report.step(f"step {name}: {status} in {seconds:.0f} s (box {box:.0f} s): {why}")

    def run(self, name: str, args: list[str], box: float, env: dict[str, str] | None = None) -> Ran:
        ran = run_boxed([self.py, *args], box, env or self.env, self.paths.work / f"{name}.out", self.paths.repo)
        self.report.logged(name, args, ran)
        if name not in NOISY:
            self.report.lines(ran.out())
        return ran

    def judged(self, name: str, ran: Ran, said: str) -> None:
        """The step's verdict from how its command ended."""
        if ran.timed_out:
            self.verdict(name, "TIMEOUT", ran.seconds, ran.box_s, f"stopped at its box; {said}")
        elif ran.rc:
            last = (ran.err().strip().splitlines() or ran.out().strip().splitlines() or ["no output"])[-1]
            self.verdict(name, "FAIL", ran.seconds, ran.box_s, f"exited {ran.rc}: {last[:300]}; {said}")
        else:
            self.verdict(name, "PASS", ran.seconds, ran.box_s, said)

    # -- the steps --------------------------------------------------------------------------------------------------
    def kit(self, site: str | None) -> bool:
        """The tuner's dependencies: the wheel kit into a site folder (or a given site-packages standing in)."""
        if site:
            self.verdict("kit", "PASS", 0.0, self.config.step("kit").box_s, f"{site} stands in for the kit")
        else:
            wheels = sorted(str(p) for p in (self.paths.repo / ".whl").glob("*.whl"))
            site = str(self.paths.work / "site")
            if not wheels:
                box = self.config.step("kit").box_s
                self.verdict("kit", "FAIL", 0.0, box, "no wheel kit in .whl/ (run benchmarks/gpu/kit.sh here)")
                return False
            args = ["-m", "pip", "install", "-q", "--no-index", "--no-deps", "--disable-pip-version-check"]
            ran = self.run("kit", [*args, "--target", site, *wheels], self.box("kit"))
            self.judged("kit", ran, f"{len(wheels)} wheels into {site}")
            if ran.rc != 0:
                return False
        self.env["PYTHONPATH"] = os.pathsep.join(
            [str(self.paths.repo), site, *filter(None, [self.env.get("PYTHONPATH")])]
        )
        bins = [str(Path(site) / "bin"), str(Path(self.py).parent), self.env.get("PATH", "")]
        self.env["PATH"] = os.pathsep.join(bins)  # ninja for DeepSpeed's JIT ops
        return True

    def env_txt(self) -> None:
        box = self.box("env")
        if box:
            ran = self.run("env", ["-m", "benchmarks.gpu.envinfo"], box)
            self.evidence.write(ev.ENV, ran.out() + ran.err())
            self.judged("env", ran, ev.ENV)

    def ops(self) -> None:
        box = self.box("ops")
        if not box:
            return
        log = self.paths.work / "ops.log"
        fail = ["--fail"] if "ops-fail" in self.config.forces else []
        ran = self.run("ops", ["-m", "benchmarks.gpu.ops_step", str(log), str(box - 5), *fail], box)
        self.evidence.write(ev.OPS, log.read_text() if log.is_file() else ran.out() + ran.err(), ev.FILE_CAP)
        forced = " (forced: a compiler that refuses every source)" if fail else ""
        self.judged("ops", ran, f"each op's build in {ev.OPS}{forced}")

    def pinned(self, options: Path) -> None:
        box = self.box("pinned")
        if not box:
            return
        choice = self.paths.work / "pinned-choice"
        ran = self.run("pinned", ["-m", "benchmarks.gpu.pinned_step", str(options), str(choice), str(box - 5)], box)
        kept = choice.read_text().strip() if choice.is_file() else "deepspeed"
        self.env["TUNER_PINNED_ALLOC"] = kept
        self.judged("pinned", ran, f"TUNER_PINNED_ALLOC={kept} for the search and the crash study")

    def search(self) -> None:
        box = self.box("search")
        if not box:
            return
        budget = plan.search_budget(
            box if "search-timeout" not in self.config.forces else self.config.step("search").box_s
        )
        ran = self.run("search", ["-m", "tuner", *cmd.search_args(self.config, self.paths, budget)], box)
        self.facts = self.read_facts()
        copied = self.evidence.database(self.paths.db_file)
        snapshot = self.evidence.snapshot(self.fact("oom_snapshot"), ev.OOM_SNAPSHOT)
        said = f"{self.facts.get('probes', 0)} probes launched; database {copied}; first OOM's snapshot: {snapshot}"
        self.judged("search", ran, said)
        self.trace_after_search()

    def crash(self) -> None:
        box = self.box("crash")
        if not box:
            return
        ran = self.run("crash", ["-m", "tuner", *cmd.crash_args(self.config, self.paths, max(10.0, box - 30))], box)
        self.facts = self.read_facts() or self.facts
        copied = self.evidence.database(self.paths.db_file)
        snapshot = self.evidence.snapshot(self.fact("crash_snapshot"), ev.CRASH_SNAPSHOT)
        self.judged("crash", ran, f"database {copied}; the crash's snapshot: {snapshot}")

    def trainer(self) -> None:
        box = self.box("trainer")
        if not box:
            return
        env = dict(self.env, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
        env["MASTER_PORT"] = str(_free_port())
        env.pop("TUNER_PINNED_ALLOC", None)  # the Trainer is the user's run: nothing of the probes' own
        env["TORCH_EXTENSIONS_DIR"] = self.extensions_dir()  # the ops the probes loaded, for its DeepSpeed too
        args = ["-m", "benchmarks.gpu.trainer_check", self.paths.db, cmd.SEARCH_STUDY, str(self.config.trainer_steps)]
        ran = self.run("trainer", [*args, str(self.paths.work / "trainer.json")], box, env)
        forced = " (forced: killed at a short box)" if "trainer-kill" in self.config.forces else ""
        self.judged("trainer", ran, f"{self.config.trainer_steps} steps + eval + generate{forced}")

    def tables(self) -> None:
        box = self.box("tables")
        if not box:
            return
        c = self.config
        args = [self.paths.db, str(c.max_fixed_s), str(c.min_probes), str(self.paths.work / "trainer.json")]
        ran = self.run("tables", ["-m", "benchmarks.gpu.tables", *args, str(c.trainer_steps), c.job.crash_gib], box)
        self.report.probes("the probe table, the OOM records, the crash, the Trainer", ran.out())
        self.judged("tables", ran, "each check above names its figure and target")

    # -- the CPU traces beside the steps ----------------------------------------------------------------------------
    def trace(self, name: str, args: list[str]) -> None:
        """A CPU trace started now beside the steps, at the lowest priority, on one thread."""
        out, env = self.paths.work / f"{name}.out", dict(self.env, OMP_NUM_THREADS="1")
        self.background[name] = Background(name, [self.py, *args], env, out, self.paths.repo)
        self.trace_args[name] = args[2:]  # without "-m tuner" / "-m benchmarks..."; see rerun_text
        self.trace_modules[name] = args[1]

    def trace_after_search(self) -> None:
        if not self.paths.db_file.is_file():
            return
        copy = self.paths.work / "copy.db"  # the background readers' own copy: the crash study writes the study's
        ev.backup(self.paths.db_file, copy)
        storage = f"sqlite:///{copy}"
        trial = self.facts.get("oom_trial")
        if isinstance(trial, int):
            self.trace("explain-trial", ["-m", "tuner", *cmd.trial_explain_args(storage, trial)])
        c = self.config
        args = [storage, cmd.SEARCH_STUDY, str(c.max_fixed_s), str(c.min_probes)]
        self.trace("estimates", ["-m", "benchmarks.gpu.probe_table", *args, "--no-checks"])

    def rerun_text(self, name: str) -> str:
        """The trace's command as it reruns on the CPU host, in a checkout beside the returned files."""
        module, args = self.trace_modules[name], self.trace_args[name]
        if module == "tuner":
            return cmd.on_the_cpu_host(args, self.paths)
        local = ["sqlite:///gpu-check.db" if a.startswith("sqlite:///") else a for a in args]
        return shlex.join(["python", "-m", module, *local])

    def traces_done(self) -> None:
        """Waits for the traces until TRACE_WAIT_S after the steps (within the deadline), then stops the rest."""
        until = min(time.monotonic() + TRACE_WAIT_S, self.deadline - self.config.step("evidence").box_s)
        for name, job in self.background.items():
            ended = job.wait(until)
            if not ended:
                job.stop()
            self.report.trace(name, job, ended, self.fact("oom_snapshot"), self.rerun_text(name))
        self.oom_message_matched()

    def oom_message_matched(self) -> None:
        """Their OOM text's allocation matched to the trace (where the model can make it: flan-t5-large's 4.81 GiB)."""
        job, gib = self.background.get("oom-message"), self.config.job.crash_gib
        if job is None or not gib:
            return
        if job.rc != 0:
            self.report.note(
                f"check their OOM's {gib} GiB matched to the trace: not checked here (the trace did not end)"
            )
            return
        matched = [line for line in job.text().splitlines() if line.strip().startswith("matched:")]
        ok = any(gib in line for line in matched)
        figure = matched[0].strip() if matched else "no matched line"
        line = Checked(f"their OOM's {gib} GiB allocation", figure, "matched to the traced allocation", ok).line()
        self.report.note(line)
        if not ok:
            self.failed.append("oom-message")

    # -- facts of the database --------------------------------------------------------------------------------------
    def read_facts(self) -> dict[str, object]:
        if not self.paths.db_file.is_file():
            return {}
        ran = run_boxed(
            [self.py, "-m", "benchmarks.gpu.facts", self.paths.db], 60, self.env, self.paths.work / "facts.out"
        )
        try:
            found = json.loads(ran.out().strip().splitlines()[-1])
        except (ValueError, IndexError):
            self.report.say(f"facts: the database could not be read ({ran.err().strip()[-300:]})")
            return {}
        return dict(found) if isinstance(found, dict) else {}

    def fact(self, key: str) -> str | None:
        value = self.facts.get(key)
        return str(value) if value else None

    def extensions_dir(self) -> str:
        cache = Path(self.env.get("TUNER_CACHE_DIR") or self.paths.work / "cache")
        done = run_boxed(
            [self.py, "-c", "from tuner.settings import load_settings; print(load_settings().torch_extensions_dir)"],
            60,
            self.env,
            self.paths.work / "extensions.out",
        )
        return done.out().strip() or str(cache / "torch_extensions")

    # -- the whole check --------------------------------------------------------------------------------------------
    def search_dry_run(self, site: str | None) -> int:
        """Only the search's own `--dry-run` (what it would probe, nothing probed): SEARCH_DRY_RUN=1."""
        cmd.write_inputs(self.config, self.paths)
        if not self.kit(site):
            return 1
        ran = self.run(
            "search-dry-run", ["-m", "tuner", *cmd.search_args(self.config, self.paths, 150), "--dry-run"], 120
        )
        print(ran.out() + ran.err(), end="")
        return ran.rc if ran.rc is not None else 1

    def steps(self, site: str | None) -> None:
        options = cmd.write_inputs(self.config, self.paths)
        if not self.kit(site):
            return
        self.trace("oom-message", ["-m", "tuner", *cmd.oom_message_args(self.config, self.paths, self.scratch_db())])
        self.env_txt()
        self.ops()
        self.pinned(options)
        self.search()
        self.crash()
        self.trainer()
        self.tables()
        self.traces_done()

    def scratch_db(self) -> str:
        return f"sqlite:///{self.paths.work / 'explain.db'}"

    def finish(self) -> int:
        """The evidence, whatever happened: the database, the log, the verdicts; the check's last line."""
        for job in self.background.values():
            job.stop()
        started = time.monotonic()
        copied = self.evidence.database(self.paths.db_file)
        self.verdict(
            "evidence", "PASS", time.monotonic() - started, self.config.step("evidence").box_s, f"database {copied}"
        )
        self.evidence.tidy()
        for problem in self.evidence.check():
            self.report.say(f"evidence: {problem}")
        took = time.monotonic() - self.start
        self.report.say(f"the check took {took:.0f} s of its {self.config.deadline_s:.0f} s deadline")
        last = f"GPU CHECK FAIL: {', '.join(self.failed)} (each said above)" if self.failed else "GPU CHECK PASS"
        self.report.final(last)
        return 1 if self.failed else 0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _interrupted(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    try:
        config = plan.from_env()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    repo = Path(__file__).resolve().parents[2]
    work = Path(os.environ.get("GPU_CHECK_WORK") or tempfile.mkdtemp(prefix="gpu-check."))
    work.mkdir(parents=True, exist_ok=True)
    out = Path(os.environ.get("OUT") or work / "out")
    env = dict(os.environ)
    env.setdefault("TUNER_CACHE_DIR", str(work / "cache"))
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error", DS_DISABLE_NVML_WARNING="1", TQDM_DISABLE="1")
    env["PYTHONUNBUFFERED"] = "1"
    check = Check(config, cmd.Paths(repo, work), out, os.environ.get("PYTHON") or sys.executable, env)
    signal.signal(signal.SIGTERM, _interrupted)
    if os.environ.get("SEARCH_DRY_RUN"):
        return check.search_dry_run(os.environ.get("KIT_SITE") or None)
    check.report.plan(plan.plan_lines(config))
    try:
        check.steps(os.environ.get("KIT_SITE") or None)
    except KeyboardInterrupt as exc:
        check.report.say(f"interrupted ({exc}): the evidence so far is written")
        check.failed.append("interrupted")
    return check.finish()


if __name__ == "__main__":
    sys.exit(main())
