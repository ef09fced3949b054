"""rdmalab.progress: long waits say what they wait for and how long is left, one whole line at
a time, never for a short wait, and past pytest's capture. Costs two small pytest
subprocesses, waits of a second): about 6 s."""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import threading
import time

import pytest

from rdmalab import progress

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def lines():
    got: list[str] = []
    lock = threading.Lock()

    def sink(line: str) -> None:
        with lock:
            got.append(line)

    old = progress.set_sink(sink)
    yield got
    progress.set_sink(old)


def test_say_writes_each_line_whole(lines):
    progress.say("vmlab: fetching linux-image-x from trixie\nsecond")
    assert lines == ["vmlab: fetching linux-image-x from trixie", "second"]


def test_a_long_wait_says_what_and_how_long_is_left(lines):
    with progress.Waiting("waiting for DISCONNECTED on a", 98, min_s=0.2, every_s=0.3) as w:
        time.sleep(1.05)
    # Lines at about 0.2, 0.5, 0.8 s: rate limited, and none after the wait ended.
    time.sleep(0.4)
    assert 2 <= len(lines) <= 4, lines
    assert w.lines == len(lines)
    test = "test_a_long_wait_says_what_and_how_long_is_left"
    pattern = re.compile(rf"rdmalab: {test}: waiting for DISCONNECTED on a: \d+ s, "
                         r"(\d+) s left of 98 s")
    for line in lines:
        m = pattern.fullmatch(line)
        assert m, line
        assert int(m.group(1)) in (97, 98)
        assert "\r" not in line


def test_a_short_wait_says_nothing(lines):
    with progress.Waiting("a short one", 0.4, min_s=0.4, every_s=0.1):
        time.sleep(0.6)  # past min_s, but so short a deadline is never registered
    with progress.Waiting("ends early", 60, min_s=0.5, every_s=0.1):
        time.sleep(0.1)
    time.sleep(0.6)
    assert lines == []


def test_waits_that_began_earlier_count_from_then(lines):
    with progress.Waiting("vm1 booting 6.1.0-56-amd64 (rxe)", 180, source="vmlab",
                          started=time.monotonic() - 20, min_s=5, every_s=10):
        time.sleep(0.3)
    assert len(lines) == 1, lines  # 20 s in: due at once
    assert re.fullmatch(r"vmlab: \S+: vm1 booting 6\.1\.0-56-amd64 \(rxe\): 20 s, 160 s left "
                        r"of 180 s", lines[0]), lines[0]


def test_several_waits_at_once_each_get_their_lines(lines):
    done = threading.Event()

    def other():
        with progress.Waiting("second", 30, min_s=0.1, every_s=0.2):
            done.wait(5)

    t = threading.Thread(target=other)
    t.start()
    with progress.Waiting("first", 30, min_s=0.1, every_s=0.2):
        time.sleep(0.5)
    done.set()
    t.join()
    assert any(": first: " in l for l in lines) and any(": second: " in l for l in lines), lines


def test_bad_interval_is_refused():
    with pytest.raises(ValueError, match="every_s"):
        progress.Waiting("x", 10, every_s=0)


def test_vmlab_uses_the_same_module():
    """The VM lab's preparation (rdmalab.machines.vmlab) says its waits through this module,
    and importing it does not load the engine: `make` prepares the VM lab while the engine
    builds, before rdmalab._core exists."""
    from rdmalab.machines.vmlab import kernel

    assert kernel.progress is progress
    code = ("import sys; from rdmalab.machines.vmlab import kernel; "
            "assert 'rdmalab._core' not in sys.modules, 'the engine was loaded'; "
            "w = kernel.waiting('building x.ko for 6.1', 600, started=__import__('time')"
            ".monotonic() - 30); w.__enter__(); __import__('time').sleep(0.5); w.__exit__(); "
            "kernel.say('fetching linux-image-y from sid')")
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=60, env=dict(env, PYTHONPATH=str(ROOT / "bindings")))
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == ["vmlab: building x.ko for 6.1: 30 s, 570 s left of 600 s",
                                     "vmlab: fetching linux-image-y from sid"], r.stderr


SCENARIO = """
import time
from rdmalab import progress

def test_long_wait():
    print("captured stdout")
    with progress.Waiting("waiting for something", 60, min_s=0.2, every_s=0.3):
        time.sleep(0.8)
"""


@pytest.mark.parametrize("how", ["install_pytest_sink", "plugin"])
def test_lines_get_past_pytest_capture(tmp_path, how):
    """Under pytest's default (fd) capture, a test's stderr is swallowed; progress lines are
    not. how: the sink installed by a conftest calling install_pytest_sink, or by the rdmalab
    plugin itself."""
    (tmp_path / "test_w.py").write_text(SCENARIO)
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)]
    if how == "plugin":
        argv[3:3] = ["-p", "rdmalab.run.pytest_plugin"]
    else:
        (tmp_path / "conftest.py").write_text(
            "from rdmalab import progress\n"
            "def pytest_configure(config):\n    progress.install_pytest_sink(config)\n")
    r = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                           [str(ROOT / "bindings"), str(ROOT)])))
    assert r.returncode == 0, r.stdout + r.stderr
    got = [l for l in r.stderr.splitlines() if "waiting for something" in l]
    assert got and all(re.fullmatch(r"rdmalab: test_long_wait: waiting for something: \d+ s, "
                                    r"\d+ s left of 60 s", l) for l in got), r.stderr
    assert "captured stdout" not in r.stdout + r.stderr  # capture itself still on


def test_an_agents_lines_are_relayed_with_this_tests_name(lines):
    """A device lab's CM waits run in the hosts' agents, which know no test: relay() (their
    sink, set by forward()) names the controller's running test in their lines."""
    progress.relay("rdmalab: waiting for DISCONNECTED on b (passive side cm_id:3): 5 s, 7 s "
                   "left of 12 s")
    test = "test_an_agents_lines_are_relayed_with_this_tests_name"
    assert lines == [f"rdmalab: {test}: waiting for DISCONNECTED on b (passive side cm_id:3): "
                     "5 s, 7 s left of 12 s"]


def test_forward_sets_the_agents_sink_and_survives_an_agent_without_it(lines):
    class FakeModule:
        sink = None

        def set_sink(self, fn):
            FakeModule.sink = fn

    class Agent:
        host = "b"

        def module(self, name):
            assert name == "rdmalab.progress"
            return FakeModule()

    progress.forward(Agent())
    assert FakeModule.sink is progress.relay

    class Old(Agent):
        def module(self, name):
            raise ImportError("No module named 'rdmalab.progress'")

    progress.forward(Old())
    assert lines and "progress lines of b's agent stay there" in lines[-1]
