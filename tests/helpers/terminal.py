"""Runs a command on a real pseudo-terminal of a given width (the kernel's pty, its window size set as a terminal
emulator sets it), so what a person sees in their terminal is what the test reads: rich and the CLI see a TTY."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import termios
import time
from collections.abc import Mapping, Sequence

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def run_in_terminal(
    argv: Sequence[str], columns: int, env: Mapping[str, str] | None = None, timeout: float = 120.0
) -> tuple[int, str]:
    """(exit code, what the terminal showed: escape sequences removed, lines joined by "\\n")."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    environ = {**os.environ, **(env or {}), "COLUMNS": str(columns), "TERM": "xterm"}
    proc = subprocess.Popen(list(argv), stdin=slave, stdout=slave, stderr=slave, env=environ, close_fds=True)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(master, 1 << 16)
            except OSError:  # EIO: the child closed its side
                break
            if not data:
                break
            chunks.append(data)
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    text = b"".join(chunks).decode("utf-8", "replace").replace("\r\n", "\n")
    return code, _ANSI.sub("", text)


__all__ = ["run_in_terminal"]
