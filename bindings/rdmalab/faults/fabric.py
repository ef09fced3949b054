"""The controller's side of the fault switch (faults/, rdmalab-switch): newline-delimited JSON
requests on its unix control socket, one reply each ({"ok": true, ...} or an "error")."""

from __future__ import annotations

import json
import socket
from typing import Any

REPLY_DEADLINE_S = 10.0
MAX_REPLY = 64 * 1024 * 1024


class SwitchError(RuntimeError):
    """The switch refused a request (the message is its error text) or did not answer."""


class SwitchControl:
    def __init__(self, path: str, deadline_s: float = REPLY_DEADLINE_S):
        self.path = str(path)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(deadline_s)
        try:
            self._sock.connect(self.path)
        except OSError as e:
            self._sock.close()
            raise SwitchError(f"switch control {self.path}: {e}") from e
        self._buf = b""

    def request(self, op: str, **fields: Any) -> dict:
        line = json.dumps({"op": op, **fields}, separators=(",", ":")).encode() + b"\n"
        try:
            self._sock.sendall(line)
            while b"\n" not in self._buf:
                chunk = self._sock.recv(65536)
                if not chunk:
                    raise SwitchError(f"switch control {self.path}: closed during {op}")
                self._buf += chunk
                if len(self._buf) > MAX_REPLY:
                    raise SwitchError(f"switch control {self.path}: reply to {op} too long")
        except socket.timeout as e:
            raise SwitchError(f"switch control {self.path}: no reply to {op} within "
                              f"{self._sock.gettimeout()} s") from e
        except OSError as e:
            raise SwitchError(f"switch control {self.path}: {op}: {e}") from e
        reply, _, self._buf = self._buf.partition(b"\n")
        answer = json.loads(reply)
        if not answer.get("ok"):
            raise SwitchError(f"switch refused {op}: {answer.get('error', answer)}")
        return answer

    def close(self) -> None:
        self._sock.close()
