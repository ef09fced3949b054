"""The plugin's wall-clock safety net (--rdmalab-timeout, default 300 s, 0 = off): a test that
runs longer fails with WallClockTimeout; if the engine never returns to Python, so the alarm
cannot be raised, faulthandler dumps every thread's stack and exits HARD_TIMEOUT_GRACE_S later
rather than hang the run."""

from __future__ import annotations

import faulthandler
import signal
import sys
import threading

import pytest

from ..errors import WallClockTimeout
from .session import SETTINGS

HARD_TIMEOUT_GRACE_S = 60  # after the soft timeout, faulthandler dumps stacks and exits


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    timeout = item.config.stash[SETTINGS].timeout_s
    if (timeout <= 0 or not hasattr(signal, "SIGALRM")
            or threading.current_thread() is not threading.main_thread()):
        yield
        return

    def on_alarm(signum, frame):
        raise WallClockTimeout(f"{item.nodeid} ran longer than {timeout:g} s of wall-clock time "
                               "(rdmalab safety net, --rdmalab-timeout)")

    old_handler = signal.signal(signal.SIGALRM, on_alarm)
    old_timer = signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        faulthandler.dump_traceback_later(timeout + HARD_TIMEOUT_GRACE_S, exit=True,
                                          file=sys.__stderr__)
    except (AttributeError, OSError, ValueError):  # no real stderr: only the soft net
        pass
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        if old_timer[0] > 0:  # an outer session's net (pytester runs nest sessions)
            signal.setitimer(signal.ITIMER_REAL, old_timer[0])
