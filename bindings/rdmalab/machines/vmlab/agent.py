"""The guest agent: runs commands for the controller over the control NIC.

It runs inside the VM (started by init.sh, with the host's python3 seen through the 9p root)
and listens on the control NIC, which qemu forwards from 127.0.0.1 on the host. One TCP
connection carries one request line and one reply line, both JSON:
  {"op": "ping"}                                  -> {"ok": true, "name": ...}
  {"op": "run", "cmd": "sh text", "timeout": s}   -> {"ok": true, "rc", "out", "err",
                                                      "timed_out", "elapsed_s"}
  {"op": "poweroff"}                              -> {"ok": true}, then the VM powers off
Connections are served in threads, so a server command (rping -s) and others run at once.
Standard library only: this file must also run under the guest's view of /usr/bin/python3.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import socketserver
import subprocess
import threading
import time

READY_MARKER = "VMLAB-READY"
MAX_REQUEST = 1 << 20
RUN_TIMEOUT_S = 600.0  # ceiling on any one command


def run(cmd: str, timeout: float) -> dict:
    start = time.monotonic()
    timeout = min(max(timeout, 0.1), RUN_TIMEOUT_S)
    # A session of its own, so a timeout kills the command's children too.
    proc = subprocess.Popen(["/bin/sh", "-c", cmd], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
    return {"ok": True, "rc": proc.returncode, "out": out.decode(errors="replace"),
            "err": err.decode(errors="replace"), "timed_out": timed_out,
            "elapsed_s": round(time.monotonic() - start, 3)}


def poweroff() -> None:
    time.sleep(0.2)  # let the reply leave first
    os.sync()
    with open("/proc/sysrq-trigger", "w") as fh:
        fh.write("o")


def handle(request: dict) -> dict:
    op = request.get("op")
    if op == "ping":
        return {"ok": True, "name": socket.gethostname()}
    if op == "run":
        return run(str(request.get("cmd", "")), float(request.get("timeout", 60)))
    if op == "poweroff":
        threading.Thread(target=poweroff, daemon=True).start()
        return {"ok": True}
    return {"ok": False, "error": f"unknown op {op!r}"}


class Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        line = self.rfile.readline(MAX_REQUEST)
        try:
            reply = handle(json.loads(line))
        except (ValueError, TypeError, OSError) as exc:
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        self.wfile.write(json.dumps(reply).encode() + b"\n")


class Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--bind", default="10.0.2.15", help="the control NIC's address")
    args = ap.parse_args()
    with Server((args.bind, args.port), Handler) as srv:
        with open("/proc/uptime") as fh:
            uptime = fh.read().split()[0]
        print(f"{READY_MARKER} {socket.gethostname()} port {args.port} uptime {uptime}",
              flush=True)
        srv.serve_forever()


if __name__ == "__main__":
    main()
