"""Errors of the Python API.

Error (a RuntimeError) carries .verb, .errno, .errno_name and .detail; its str() is the engine's
message, e.g. "ibv_post_send: EBADF (9): qp 3 was destroyed". DeadlineExceeded is a subclass.
Hung is the DeadlineExceeded of Lab.wait_until: its message is a diagnostic dump.
FaultNotSupported says a backend cannot apply a fault (errno EOPNOTSUPP). HostLost says a host
stopped answering mid-scenario (errno EHOSTDOWN). WorkloadError says a workload's step failed on a
host (its errno, or 0).

API misuse is an Error with errno EINVAL too, naming the verb and what was wrong: an object of
another context or host (the engine's check_owner: "pd pd:2 is of ctx:1 on host a, not of
ctx:9 on host b"), an integer outside its C type's range (OutOfRange, which is a TypeError
too: "cqe = 1099511627776 is outside int32 (...)"), a negative duration or timeout
("duration_ns = -1 is negative": duration_ns() and deadline_ns() below). A value of the wrong
type stays a TypeError.

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
# An integer outside its C type's range: an Error (EINVAL) that is also a TypeError.
OutOfRange = _core.OutOfRange


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


class WorkloadError(Error):
    """A step of a workload (rdmalab.workloads) failed on a host: .step ("nvme connect"),
    .host, .errno (the kernel's, where one was said; else 0), .detail (what the tool or the
    kernel said). The step's `workload` history record says the same."""

    def __init__(self, step: str, host: str, err: int, detail: str):
        text = f"on {host}: {detail}"
        super().__init__(_core.format_error(step, err, text) if err else f"{step}: {text}")
        _fill(self, step, err, text)
        self.step, self.host = step, host


def as_fault(fault: str, fn, *args):
    """fn(*args), with the engine's EOPNOTSUPP raised as FaultNotSupported(fault): the backend
    cannot do it, so a scenario that needs it skips instead of failing."""
    try:
        return fn(*args)
    except Error as e:
        if e.errno == _errno.EOPNOTSUPP:
            raise FaultNotSupported(fault, e.detail or str(e)) from e
        raise


INT64_MAX = 2**63 - 1  # TimeNs: the clock's end


def out_of_range_kept(build):
    """build (a rdmalab.api.requests builder) whose OutOfRange is raised as itself: the builders
    turn every TypeError of a field into a plain TypeError ("bad value ... for timeout"), and
    the verbs want the engine's error naming the verb and the field."""
    def call(*args, **kw):
        try:
            return build(*args, **kw)
        except TypeError as e:
            cause = e.__cause__ or e.__context__
            if isinstance(cause, OutOfRange):
                raise cause from None
            raise
    call.__name__, call.__doc__ = build.__name__, build.__doc__
    return call


def duration_ns(verb: str, value, name: str = "duration_ns") -> int:
    """value as a duration in ns for verb: an int (bool and float: TypeError), refused with
    Error(verb, EINVAL) naming `name` when negative ("duration_ns = -1 is negative") or beyond
    a TimeNs (int64). Every lab's sleep, run_for and wait_until, and the timeouts of the
    verbs and stack helpers, go through it."""
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            value = value.__index__()
        except AttributeError:
            raise TypeError(f"{verb}: {name} must be an int of ns, got "
                            f"{type(value).__name__}") from None
    if value < 0:
        raise make_error(verb, _errno.EINVAL, f"{name} = {value} is negative")
    if value > INT64_MAX:
        raise make_error(verb, _errno.EINVAL, f"{name} = {value} is outside int64 "
                         f"(-9223372036854775808..{INT64_MAX})", OutOfRange)
    return value


def deadline_ns(verb: str, now_ns: int, timeout_ns, name: str = "timeout_ns") -> int:
    """The deadline now_ns + timeout_ns, the timeout checked as duration_ns() does; one past
    the clock's end is clamped to it (the longest wait there is)."""
    return min(now_ns + duration_ns(verb, timeout_ns, name), INT64_MAX)


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
