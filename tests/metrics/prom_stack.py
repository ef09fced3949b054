"""A real Prometheus and Pushgateway on loopback for the metrics tests (Debian's prometheus and
prometheus-pushgateway, installed by `make deps`): temp storage, generated config, free ports,
every wait with a deadline, every server stopped at the end."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Callable, Optional

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
PUSHGATEWAY = shutil.which("prometheus-pushgateway")
HTTP_TIMEOUT_S = 5.0
STOP_TIMEOUT_S = 10.0


def missing() -> Optional[str]:
    """Why the servers cannot run here, or None (make deps installs them: CI never skips)."""
    absent = [name for name, path in (("prometheus", PROMETHEUS), ("promtool", PROMTOOL),
                                      ("prometheus-pushgateway", PUSHGATEWAY)) if path is None]
    if absent:
        return (f"{', '.join(absent)} not installed (Debian packages prometheus, "
                "prometheus-pushgateway; `make deps` installs them)")
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Loopback only: an http_proxy in the environment must not see these requests.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_get(url: str) -> tuple[int, str]:
    """(status, body); status 0 when nothing answers."""
    try:
        with _OPENER.open(url, timeout=HTTP_TIMEOUT_S) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except (urllib.error.URLError, OSError):
        return 0, ""


def wait_for(what: str, fn: Callable[[], object], timeout_s: float, interval_s: float = 0.1,
              detail: Callable[[], str] = lambda: ""):
    """fn()'s first truthy value; AssertionError naming `what` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}. {detail()}")
        time.sleep(interval_s)


class Server:
    """A child process with its output in a log file; stop() terminates it (then kills)."""

    url: Optional[str] = None  # servers with a /-/ready endpoint

    def __init__(self, name: str, argv: list[str], log: Path, **popen):
        self.name, self.log = name, log
        self._log = open(log, "wb")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True, **popen)

    def wait_ready(self) -> None:
        """Returns once the server answers its readiness endpoint (a deadline of 30 s)."""
        url = self.url
        if url is not None:
            wait_for(f"{self.name} to be ready", lambda: http_get(url + "/-/ready")[0] == 200,
                     30, detail=self.tail)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace").splitlines()[-lines:]
        return f"--- {self.name} log ({self.log}) ---\n" + "\n".join(text)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # its own session: children go too
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(STOP_TIMEOUT_S)
        self._log.close()


class Pushgateway(Server):
    def __init__(self, workdir: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__("pushgateway", [
            PUSHGATEWAY, f"--web.listen-address=127.0.0.1:{self.port}",
            f"--persistence.file={workdir / 'pushgateway.data'}", "--log.level=warn"],
            workdir / "pushgateway.log")


class Prometheus(Server):
    """Prometheus with a generated config (JSON is YAML) and its own temp storage."""

    def __init__(self, workdir: Path, config: dict):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = workdir / "prometheus.json"
        cfg.write_text(json.dumps(config, indent=2))
        super().__init__("prometheus", [
            PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            workdir / "prometheus.log")

    def api(self, path: str, **params) -> dict:
        status, body = http_get(f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}")
        if status == 0:
            raise AssertionError(f"Prometheus did not answer /api/v1/{path}. {self.tail()}")
        reply = json.loads(body)
        if reply.get("status") != "success":
            raise AssertionError(f"/api/v1/{path} {params}: {reply.get('errorType')}: "
                                 f"{reply.get('error')}")
        return reply["data"]

    def query(self, expr: str) -> list:
        """An instant query's result vector (or scalar/string as a one-item list)."""
        data = self.api("query", query=expr)
        return data["result"] if data["resultType"] in ("vector", "matrix") else [data["result"]]

    def value(self, expr: str) -> Optional[float]:
        """The value of a query with one sample, None when it has none."""
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None
