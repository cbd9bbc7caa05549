"""Headless Chromium (Debian's) driven over the DevTools protocol on a pipe (--remote-debugging-pipe: NUL-separated
JSON on fds 3/4), so a test sees console levels exactly — Chromium's stderr log does not tell console.error from
console.log. ``open_browser`` is the tests' fixture body: without chromium it fails with one line (it does not skip,
so a CI whose scripts/system-deps.sh could not install it cannot pass silently); TUNER_TEST_CHROMIUM=skip skips on a
laptop.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


class Chromium:
    """Headless Chromium with the DevTools protocol on a pipe; one page, events collected."""

    def __init__(self, user_data: Path) -> None:
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        os.set_inheritable(to_child_r, True)
        os.set_inheritable(from_child_w, True)

        def fds() -> None:  # in the child: chromium reads commands on fd 3 and writes replies on fd 4
            os.dup2(to_child_r, 3)
            os.dup2(from_child_w, 4)

        self.proc = subprocess.Popen(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                "--disable-extensions",
                f"--user-data-dir={user_data}",
                "--remote-debugging-pipe",
                "--window-size=1280,2000",
                "about:blank",
            ],
            preexec_fn=fds,
            pass_fds=(3, 4, to_child_r, from_child_w),  # 3, 4: kept open after the dup2 above
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict[str, Any]] = []
        self.session: str | None = None

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            if time.monotonic() > deadline:
                raise TimeoutError("chromium did not answer in time")
            chunk = os.read(self._from_child, 1 << 20)
            if not chunk:
                raise RuntimeError(f"chromium closed the pipe (exit {self.proc.poll()})")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def send(
        self, method: str, params: dict[str, Any] | None = None, timeout: float = 60.0, session: bool = True
    ) -> dict[str, Any]:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str, timeout: float = 60.0) -> dict[str, Any]:
        for ev in self.events:
            if ev.get("method") == method:
                return ev
        deadline = time.monotonic() + timeout
        while True:
            ev = self._read_message(deadline)
            self.events.append(ev)
            if ev.get("method") == method:
                return ev

    def open_page(self) -> None:
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True}, session=False)[
            "sessionId"
        ]
        for domain in ("Page.enable", "Runtime.enable", "Log.enable"):
            self.send(domain)

    def load(self, url: str) -> None:
        self.events.clear()
        self.send("Page.navigate", {"url": url})
        self.wait_event("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        res = self.send("Runtime.evaluate", {"expression": expression, "awaitPromise": True, "returnByValue": True})
        return res["result"].get("value")

    def errors(self) -> list[str]:
        """console.error/assert calls, uncaught exceptions and error-level log entries seen since the last load."""
        out = []
        for ev in self.events:
            method, params = ev.get("method"), ev.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                out.append("console: " + " ".join(str(a.get("value", a.get("description"))) for a in params["args"]))
            elif method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                described = details.get("exception", {}).get("description", "")
                out.append(f"exception: {details.get('text', '')} {described}".strip())
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                out.append("log: " + params["entry"].get("text", ""))
        return out

    def screenshot(self, path: Path) -> None:
        data = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, TimeoutError, OSError):
            self.send("Browser.close", timeout=10, session=False)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_child)
        os.close(self._from_child)


def open_browser(tmp_path: Path) -> Iterator[Chromium]:
    """One headless Chromium page (a fixture's body: ``yield from open_browser(tmp_path)``)."""
    if not os.path.exists(CHROMIUM):
        if os.environ.get("TUNER_TEST_CHROMIUM") == "skip":
            pytest.skip("TUNER_TEST_CHROMIUM=skip")
        pytest.fail(
            f"chromium not found (PATH, {CHROMIUM}); run scripts/system-deps.sh or set TUNER_TEST_CHROMIUM=skip",
            pytrace=False,
        )
    b = Chromium(tmp_path / "chromium-profile")
    b.open_page()
    yield b
    b.close()
