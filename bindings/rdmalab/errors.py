"""Errors of the Python API.

Error (a RuntimeError) carries .verb, .errno, .errno_name and .detail; its str() is the engine's
message, e.g. "ibv_post_send: EBADF (9): qp 3 was destroyed". DeadlineExceeded is a subclass.
Hung is the DeadlineExceeded of Lab.wait_until: its message is a diagnostic dump.
FaultNotSupported says a backend cannot apply a fault (errno EOPNOTSUPP). HostLost says a host
stopped answering mid-scenario (errno EHOSTDOWN).

Python exceptions raised inside callbacks the engine runs (dispatcher handlers, packet and verb
hooks, timers, wait predicates) cannot cross the engine's threads. The bindings record them in
the lab's history (kind "python_error") and park them; raise_parked() re-raises them. The Lab
calls it after every call that advances time and the pytest plugin at teardown, so a failing
handler always fails its test.
"""

from __future__ import annotations

import errno as _errno

from . import _core

Error = _core.Error
DeadlineExceeded = _core.DeadlineExceeded


def _fill(exc, verb: str, err: int, detail: str):
    exc.verb = verb
    exc.errno = err
    exc.errno_name = _core.errno_name(err)
    exc.detail = detail
    return exc


def make_error(verb: str, err: int, detail: str = "", cls=Error):
    """An Error (or subclass) formatted exactly as the engine formats its own."""
    return _fill(cls(_core.format_error(verb, err, detail)), verb, err, detail)


class Hung(DeadlineExceeded):
    """A wait reached its deadline. str() is the diagnostic dump; .what says what was awaited."""

    def __init__(self, what: str, dump: str, verb: str = "wait_until"):
        super().__init__(dump)
        _fill(self, verb, _errno.ETIMEDOUT, what)
        self.what = what


class FaultNotSupported(Error):
    """The backend (or the device's personality) cannot apply this fault."""

    def __init__(self, fault: str, reason: str):
        super().__init__(_core.format_error(fault, _errno.EOPNOTSUPP, reason))
        _fill(self, fault, _errno.EOPNOTSUPP, reason)
        self.fault = fault


class HostLost(Error):
    """A host of the lab stopped answering mid-scenario (a crash, a reboot nobody asked for, a
    lost SSH session): .host, .info (machine, at_ns, error, records_kept). The scenario's
    outcome is host_lost; the lab restarts the host before the next scenario."""

    def __init__(self, host: str, info: dict):
        detail = (f"host {host} ({info.get('machine')}) lost at t={info.get('at_ns', 0) / 1e9:.3f}"
                  f" s: {info.get('error')}; {info.get('records_kept')} of its records kept")
        super().__init__(_core.format_error("host", _errno.EHOSTDOWN, detail))
        _fill(self, "host", _errno.EHOSTDOWN, detail)
        self.host, self.info = host, dict(info)


def as_fault(fault: str, fn, *args):
    """fn(*args), with the engine's EOPNOTSUPP raised as FaultNotSupported(fault): the backend
    cannot do it, so a scenario that needs it skips instead of failing."""
    try:
        return fn(*args)
    except Error as e:
        if e.errno == _errno.EOPNOTSUPP:
            raise FaultNotSupported(fault, e.detail or str(e)) from e
        raise


class WallClockTimeout(Exception):
    """The pytest plugin's safety net: a test ran longer than its wall-clock budget."""


def raise_parked() -> None:
    """Re-raises exceptions parked by callbacks: one as itself, several as an ExceptionGroup."""
    if not _core.pending_python_errors():
        return
    errors = []
    for where, exc in _core.take_python_errors():
        exc.add_note(f"rdmalab: raised in {where} (run by the engine), re-raised by check_errors()")
        errors.append(exc)
    if len(errors) == 1:
        raise errors[0]
    if all(isinstance(e, Exception) for e in errors):
        raise ExceptionGroup(f"{len(errors)} errors in engine callbacks", errors)
    raise BaseExceptionGroup(f"{len(errors)} errors in engine callbacks", errors)
