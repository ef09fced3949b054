"""Progress lines for long waits: what is awaited and how long is left, one line at a time.

    from rdmalab import progress
    progress.say("vmlab: fetching linux-image-6.12.117+deb13-amd64 from trixie")
    with progress.Waiting("waiting for DISCONNECTED on a", deadline_s=98):
        ...  # a blocking call or a polling loop

A wait says nothing for its first MIN_S seconds, then one line every EVERY_S seconds until
it ends ("rdmalab: test_x[vm-rxe]: waiting for DISCONNECTED on a: 15 s, 83 s left of 98 s"),
from one shared daemon thread, so a wait that blocks in a call needs nothing from its caller;
a wait whose deadline is MIN_S or less never registers. Lines are whole lines (no carriage
returns), readable in a terminal and in a CI log alike.

The sink is stderr, flushed per line. Under pytest, whose capture would hide it, the rdmalab
plugin calls install_pytest_sink(config) to write to a copy of the terminal's stderr instead.
A device lab's CM waits run in its hosts' agents: forward(agent) relays their lines here.
It imports nothing of rdmalab, so the VM lab's preparation (rdmalab.machines.vmlab) uses it
before the engine is built.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable, Optional

MIN_S = 5.0     # a wait shorter than this prints nothing
EVERY_S = 10.0  # then one line per this many seconds per wait
PRINT_WAIT_S = 2.0  # how long a wait's end waits for its line being written

_sink_lock = threading.Lock()


def _stderr_sink(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # a closed stderr (interpreter exit): progress is optional
        pass


_sink: Callable[[str], None] = _stderr_sink


def set_sink(fn: Optional[Callable[[str], None]]) -> Callable[[str], None]:
    """Sends every later line to fn (None: stderr again); returns the previous sink."""
    global _sink
    with _sink_lock:
        old, _sink = _sink, (fn or _stderr_sink)
    return old


def say(msg: str) -> None:
    """One progress line (a message with newlines becomes several lines)."""
    with _sink_lock:
        for line in msg.splitlines() or [""]:
            _sink(line)


def current_test() -> str:
    """The running pytest test's name with its parameters ("test_x[vm-rxe]"), or ""."""
    cur = os.environ.get("PYTEST_CURRENT_TEST", "")
    return cur.rsplit(" (", 1)[0].rsplit("::", 1)[-1] if cur else ""


def _secs(s: float) -> str:
    return f"{s:.0f} s"


class Waiting:
    """A context for one wait with a deadline: after MIN_S seconds, a line every EVERY_S
    seconds saying what it waits for, how long it has waited and how long is left.
    source prefixes the line ("rdmalab", "vmlab"); the running test's name follows it.
    started: the wait's start (time.monotonic()) where it began before the context."""

    def __init__(self, what: str, deadline_s: float, *, source: str = "rdmalab",
                 min_s: float = MIN_S, every_s: float = EVERY_S,
                 started: Optional[float] = None) -> None:
        if every_s <= 0:
            raise ValueError(f"Waiting every_s={every_s}: must be positive")
        self.what, self.deadline_s, self.source = what, float(deadline_s), source
        self.min_s, self.every_s = min_s, every_s
        self.test = current_test()
        self.started = started  # time.monotonic() when the wait began, if before __enter__
        self.start = 0.0
        self.next_at = 0.0
        self.lines = 0  # how many lines this wait printed

    def line(self, now: float) -> str:
        waited = now - self.start
        head = f"{self.source}: {self.test}: " if self.test else f"{self.source}: "
        return (f"{head}{self.what}: {_secs(waited)}, "
                f"{_secs(max(0.0, self.deadline_s - waited))} left of {_secs(self.deadline_s)}")

    def __enter__(self) -> "Waiting":
        self.start = time.monotonic() if self.started is None else self.started
        self.next_at = self.start + self.min_s
        if self.deadline_s > self.min_s:
            _ticker.add(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _ticker.remove(self)


class _Ticker:
    """One daemon thread for every active wait; sleeps until the earliest line is due."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active: dict[int, Waiting] = {}
        self._thread: Optional[threading.Thread] = None
        self._wake_at = float("inf")  # when the thread wakes by itself
        self._printing: set[int] = set()  # the waits whose lines are being written now

    def add(self, w: Waiting) -> None:
        with self._cond:
            self._active[id(w)] = w
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="rdmalab-progress",
                                                daemon=True)
                self._thread.start()
            elif w.next_at < self._wake_at:  # else the thread wakes in time anyway
                self._cond.notify()

    def remove(self, w: Waiting) -> None:
        with self._cond:
            self._active.pop(id(w), None)
            end = time.monotonic() + PRINT_WAIT_S
            while id(w) in self._printing and time.monotonic() < end:
                self._cond.wait(0.1)  # its line is being written: return after it, bounded

    def _loop(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                due = []
                for w in self._active.values():
                    if w.next_at <= now:
                        due.append(w.line(now))
                        self._printing.add(id(w))
                        w.lines += 1
                        while w.next_at <= now:
                            w.next_at += w.every_s
                self._wake_at = min((w.next_at for w in self._active.values()),
                                    default=float("inf"))
            # Outside the lock (a stuck stderr must not block every wait's start and end);
            # only a wait whose line this is waits for it in remove().
            try:
                for line in due:
                    say(line)
            except Exception:  # a sink that failed (a closed relay): progress is optional
                pass
            finally:
                with self._cond:
                    self._printing.clear()
                    self._cond.notify_all()
            with self._cond:
                timeout = self._wake_at - time.monotonic()
                if timeout > 0:
                    self._cond.wait(None if timeout == float("inf") else timeout)


_ticker = _Ticker()


def relay(line: str) -> None:
    """A line from an agent (a device lab's host, where rdmalab runs the scenario's verbs and
    CM waits): said here, with this process's running test named in it."""
    test = current_test()
    source, sep, rest = line.partition(": ")
    if test and sep and " " not in source and not rest.startswith(test + ": "):
        line = f"{source}: {test}: {rest}"
    say(line)


def forward(agent) -> None:
    """Sends the progress lines of an agent's process (rdmalab.agent.remote.Agent) to this one's
    sink through relay(); an agent without this module (an older one) is left as it is."""
    try:
        agent.module("rdmalab.progress").set_sink(relay)
    except Exception as exc:  # noqa: BLE001 (any RPyC failure: progress is optional)
        say(f"rdmalab: progress lines of {getattr(agent, 'host', '?')}'s agent stay there: "
            f"{type(exc).__name__}: {exc}")


def install_pytest_sink(config) -> None:
    """Under pytest: lines go to a duplicate of the real stderr taken now (pytest_configure,
    outside capture), so the capture of a test's output never swallows them. A line starts on
    a line of its own when the terminal reporter is in the middle of one (its progress dots)."""
    capman = config.pluginmanager.getplugin("capturemanager")
    if capman is not None:
        with capman.global_and_fixture_disabled():
            fd = os.dup(2)
    else:
        fd = os.dup(2)
    os.set_inheritable(fd, False)
    seen = [0]  # the reporter's column when this sink last ended a line

    def sink(line: str) -> None:
        # Looked up here: the terminal reporter may register after this plugin's configure.
        reporter = config.pluginmanager.getplugin("terminalreporter")
        tw = getattr(reporter, "_tw", None)
        col = int(getattr(tw, "width_of_current_line", 0) or 0) if tw is not None else 0
        mid_line = col > 0 and col != seen[0]  # it wrote since: not at a line's start
        seen[0] = col
        try:
            os.write(fd, (("\n" if mid_line else "") + line + "\n").encode(errors="replace"))
        except OSError:
            pass

    def close() -> None:
        set_sink(previous)  # an in-process pytest (pytester) hands the outer one's back
        try:
            os.close(fd)
        except OSError:
            pass

    previous = set_sink(sink)
    config.add_cleanup(close)
