"""A real headless Chromium for tests, driven over the DevTools protocol on a pipe (no websocket, no
library): ``--remote-debugging-pipe`` reads NUL-terminated JSON commands on fd 3 and writes replies
and events on fd 4.

The browser runs with every host name resolving to nothing and a proxy that refuses every
connection, so a page that tries to reach the network fails to; each request the page makes is
recorded (``requests``), and so is every Content-Security-Policy violation (``violations``), every
console message and log entry (``console``) and every uncaught exception (``exceptions``).
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
OFFLINE = ["--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>"]
WATCH_VIOLATIONS = """
window.__violations = [];
document.addEventListener("securitypolicyviolation",
    e => window.__violations.push(e.violatedDirective + " " + e.blockedURI));
"""


def browser() -> str:
    """The Chromium binary, or skip with the reason (CI's .ci/run installs Debian's chromium)."""
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("no headless Chromium on this machine (apt-get install chromium; .ci/run installs it)")


class Page:
    """One tab of a fresh headless Chromium, with its own profile folder under ``scratch``."""

    def __init__(self, scratch: Path, width: int = 1400, height: int = 1000) -> None:
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def fds() -> None:  # the child: fd 3 is what it reads, fd 4 what it writes
            os.dup2(to_browser_r, 3)
            os.dup2(from_browser_w, 4)

        args = [browser(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--remote-debugging-pipe", f"--user-data-dir={scratch / 'profile'}", *OFFLINE,
                "about:blank"]  # fmt: skip
        self.proc = subprocess.Popen(
            args, preexec_fn=fds, pass_fds=(3, 4), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next = 0
        self.events: list[dict[str, Any]] = []
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Network", "Runtime", "Log"):
            self.call(f"{domain}.enable")
        self.call("Page.addScriptToEvaluateOnNewDocument", {"source": WATCH_VIOLATIONS})
        self.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1,
                                                         "mobile": False})  # fmt: skip

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout: float = 30.0) -> dict[str, Any]:  # fmt: skip
        """One command; its result (the events that arrive meanwhile are kept in ``events``)."""
        self._next += 1
        message: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return dict(reply.get("result") or {})
            self.events.append(reply)

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.send(method, params, self.session)

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise RuntimeError(f"Chromium exited ({self.proc.poll()})")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return dict(json.loads(raw))

    def wait_for(self, method: str, timeout: float = 30.0) -> dict[str, Any]:
        """The first event ``method`` (of this tab), waiting for it."""
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            for event in self.events[seen:]:
                if event.get("method") == method:
                    return event
            seen = len(self.events)
            self.events.append(self._read(deadline))

    def open(self, url: str) -> None:
        """Navigate and wait until the page has loaded (its scripts have run)."""
        self.call("Page.navigate", {"url": url})
        self.wait_for("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True})  # fmt: skip
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def mouse(self, kind: str, x: float, y: float, button: str = "left", clicks: int = 1) -> None:
        self.call("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": button, "clickCount": clicks})

    def screenshot(self, path: Path) -> bytes:
        """A PNG of the whole page (beyond the window's height), written to ``path``."""
        data = base64.b64decode(self.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
                                ["data"])  # fmt: skip
        path.write_bytes(data)
        return data

    @property
    def requests(self) -> list[str]:
        return [e["params"]["request"]["url"] for e in self.events if e.get("method") == "Network.requestWillBeSent"]

    @property
    def failed(self) -> list[str]:
        return [str(e["params"]) for e in self.events if e.get("method") == "Network.loadingFailed"]

    @property
    def exceptions(self) -> list[str]:
        return [
            str(e["params"]["exceptionDetails"]) for e in self.events if e.get("method") == "Runtime.exceptionThrown"
        ]

    @property
    def console(self) -> list[str]:
        out = [str(e["params"]["entry"].get("text")) for e in self.events if e.get("method") == "Log.entryAdded"]
        return out + [
            str(e["params"].get("args")) for e in self.events if e.get("method") == "Runtime.consoleAPICalled"
        ]

    def violations(self) -> list[str]:
        return list(self.evaluate("window.__violations || []"))

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=5)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)
