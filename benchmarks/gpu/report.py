"""What the GPU check says, and where (stdlib only): its own lines on stdout and in the log; one line per step in
verdicts.txt (rewritten after every step, so a kill leaves the ones so far); the tables and the traces' findings in
probes.txt; every command's whole output in gpu_check.log; the CPU traces' rerun commands where they did not end."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from benchmarks.gpu import evidence as ev
from benchmarks.gpu.boxed import Background, Ran
from benchmarks.gpu.commands import unzip_snapshot

#: the lines of each trace's output that say what it found (the rest stays in probes.txt and the log)
FOUND = {
    "oom-message": re.compile(r"your OOM message|matched"),
    "explain-trial": re.compile(r"^trial \d+ of study|refused|snapshot|recorded failure|tried to allocate"),
    "estimates": re.compile(r"^probe |^estimate|^check "),
}
HEADERS = {
    "oom-message": "tuner explain --oom-message @tests/data/seed/oom.txt (their text) at their worst batch",
    "explain-trial": "tuner explain --study gpu-check --trial {trial}",
    "estimates": "the probe table with the estimate column",
}


class Report:
    def __init__(self, evidence: ev.Evidence, log: Path) -> None:
        self.evidence = evidence
        self.log_path = log
        self.plan_lines: list[str] = []
        self.step_lines: list[str] = []
        self.notes: list[str] = []  # the rerun commands, the traces' fates
        self.sections: list[str] = []
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("")

    def _log(self, text: str) -> None:
        with open(self.log_path, "a") as fh:
            fh.write(text if text.endswith("\n") else text + "\n")

    def say(self, line: str) -> None:
        print(line, flush=True)
        self._log(line)

    def lines(self, text: str) -> None:
        for line in text.splitlines():
            if line.strip():
                print(line, flush=True)

    def plan(self, lines: list[str]) -> None:
        self.plan_lines = lines
        for line in lines:
            self.say(line)
        self.write_verdicts()

    def step(self, line: str) -> None:
        self.say(line)
        self.step_lines.append(line)
        self.write_verdicts()

    def note(self, line: str) -> None:
        self.say(line)
        self.notes.append(line)
        self.write_verdicts()

    def write_verdicts(self, last: str = "") -> None:
        text = "\n".join([*self.plan_lines, "", *self.step_lines, *self.notes, *([last] if last else [])])
        self.evidence.write(ev.VERDICTS, text + "\n")

    def logged(self, name: str, args: list[str], ran: Ran) -> None:
        how = "stopped at its box" if ran.timed_out else f"exit {ran.rc}"
        self._log(f"\n===== {name}: {shlex.join(args)} ({how}, {ran.seconds:.1f} s)\n{ran.out()}{ran.err()}")
        self.evidence.log(self.log_path)

    def probes(self, title: str, text: str) -> None:
        self.sections.append(f"== {title}\n{text.rstrip()}\n")
        self.evidence.write(ev.PROBES, "\n".join(self.sections), ev.FILE_CAP)

    def trace(self, name: str, job: Background, ended: bool, snapshot: str | None, rerun: str) -> None:
        """A CPU trace's findings (ended), or that it did not end within the check and how it reruns."""
        self._log(f"\n===== trace {name} ({'exit ' + str(job.rc) if ended else 'stopped'}, {job.seconds:.0f} s)\n")
        self._log(job.text() + _read(job.out.with_suffix(".err")))
        if ended and job.rc == 0:
            header = HEADERS[name].format(trial=rerun.rsplit(" ", 1)[-1])
            self.say(f"== {header}")
            self.lines("\n".join(line for line in job.text().splitlines() if FOUND[name].search(line)))
            self.probes(header, job.text())
            return
        why = f"exit {job.rc}" if ended else f"not done in {job.seconds:.0f} s"
        before = f"{unzip_snapshot(snapshot)}; " if name == "explain-trial" and snapshot else ""
        self.note(f"trace {name}: {why}: rerun on the CPU host beside the returned files: {before}{rerun}")

    def final(self, last: str) -> None:
        self.say(last)
        self.write_verdicts(last)
        self.evidence.log(self.log_path)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


__all__ = ["Report"]
