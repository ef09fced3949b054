"""The controller-agent path without a VM: an agent in a local subprocess (execnet popen),
driven over RPyC on the execnet channel, with a verbs lab of this machine (no RDMA device
here, so only what needs none), and the --lab vm option parsing and fallback."""

import dataclasses
import json
import os
import threading
import time

import pytest

from rdmalab.run import cli
from rdmalab.run.labkinds import LAB_KINDS
from rdmalab.run.labspec import parse_lab_option, parse_lab_options

execnet = pytest.importorskip("execnet", reason="python3-execnet is not installed")
pytest.importorskip("rpyc", reason="python3-rpyc is not installed")

from rdmalab.agent import remote  # noqa: E402


@pytest.fixture
def agent():
    gw = execnet.makegateway("popen//python=/usr/bin/python3")
    a = remote.Agent.start(gw, "a")
    yield a
    a.close()


def test_agent_runs_a_verbs_lab_named_as_the_scenario_names_it(agent):
    lab = agent.new_lab(7, "a", {"a": "10.0.0.1", "b": "10.0.0.2"})
    assert lab.backend == "verbs" and lab.seed == 7
    assert list(lab.hosts) == ["a"]
    assert lab.address_of("b") == "10.0.0.2"
    host = lab.host("a")
    assert remote.is_remote(host) and remote.agent_of(host) is agent
    assert host.name == "a"


def meter_threads(agent) -> int:
    """The agent's stall-meter threads (the engine names each such thread so)."""
    os_, builtins = agent.module("os"), agent.module("builtins")
    n = 0
    for tid in os_.listdir("/proc/self/task"):
        try:
            n += builtins.open(f"/proc/self/task/{tid}/comm").read().strip() == "stall-meter"
        except OSError:  # the thread ended meanwhile
            pass
    return n


def test_an_agent_keeps_no_thread_or_lab_of_a_scenario_that_ended(agent):
    """One lab per scenario: each new_lab shuts the last one down, whose threads (its stall
    meter's among them) end there, and the agent lets go of it."""
    tracked = agent.module("rdmalab.agent.serve")._LABS
    for seed in range(1, 6):
        agent.new_lab(seed, "a", {})
    assert len(tracked) == 1, f"the agent keeps {len(tracked)} labs, not the last one only"
    # A joined thread's /proc entry may linger a moment, and the last lab's meter names its
    # thread only once it runs (on a loaded machine, later than new_lab's return).
    deadline = time.monotonic() + 5
    while meter_threads(agent) != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert meter_threads(agent) == 1, "the meters of the labs shut down are still running"


def test_value_objects_come_as_copies_and_live_ones_as_proxies(agent):
    """A frozen dataclass of data (a WC) and a list of them cross in one message as copies;
    one that holds a live object (a CmEvent's raw event) stays a proxy to the agent's."""
    from rdmalab.api.verbs import WC
    wc = agent.module("rdmalab.api.verbs").WC(7, "SUCCESS", "SEND", 0, 64, 0, 5, 0, False)
    assert type(wc) is WC and not remote.is_remote(wc)
    assert (wc.wr_id, wc.status, wc.qp_num) == (7, "SUCCESS", 5)
    wcs = agent.module("builtins").list([wc, wc])
    assert type(wcs) is list and [type(w) for w in wcs] == [WC, WC]
    live = agent.module("rdmalab.api.cm").CmEvent("ESTABLISHED", 0, 1, 0, b"", 1, 0,
                                               agent.module("threading").Lock())
    assert remote.is_remote(live) and live.event == "ESTABLISHED"


def test_a_copy_of_plain_data_comes_in_one_message(agent):
    """call_copy: the result itself, not a proxy whose reads would each ask the agent."""
    got = agent.call_copy("os.path", "split", "/a/b")
    assert type(got) is tuple and got == ("/a", "b")
    env = agent.call_copy("os", "getenv", "PATH")
    assert type(env) is str


def test_history_after_waits_for_the_next_record_and_no_longer(agent):
    """The follower's fetch blocks in the agent until a record comes (no polling there), and
    comes back empty at the end of its wait. The machine's own stall records may come
    meanwhile (a loaded host): those end a wait as any record does."""
    lab = agent.new_lab(1, "a", {})
    since = int(lab._o.history_next_seq())
    t0 = time.monotonic()
    got = agent.history_after(since, 0.2)
    assert {json.loads(line)["kind"] for line in got.splitlines()} <= {"stall"}, got
    assert got or time.monotonic() - t0 >= 0.2, "an empty fetch came back before its wait"
    since += len(got.splitlines())
    writer = threading.Timer(0.1, lambda: lab.record("note", text="now"))
    writer.start()
    t0, text = time.monotonic(), ""
    while '"kind":"note"' not in text and time.monotonic() - t0 < 30:
        text += agent.history_after(since + len(text.splitlines()), 60.0)
    writer.join()
    assert '"kind":"note"' in text and '"text":"now"' in text, text
    assert time.monotonic() - t0 < 30, "the fetch waited for its deadline, not for the record"


def test_agent_clock_is_offset_onto_the_controllers(agent):
    lab = agent.new_lab(1, "a", {})
    before = time.monotonic_ns()
    remote_now = lab.now_ns
    after = time.monotonic_ns()
    # The agent's clock, offset by the measured difference, lies within the round trip.
    assert before - 50_000_000 <= remote_now <= after + 50_000_000


def test_a_machine_that_stands_still_is_measured(agent):
    """SIGSTOP the agent's process for 300 ms (what a TCG guest's vCPU on a loaded host does
    to every thread in the guest): its stall meter measures it on the lab's clock, inside the
    window and not outside, and records it."""
    import signal
    lab = agent.new_lab(1, "a", {})
    pid = agent.module("os").getpid()
    time.sleep(0.05)
    t0 = lab.now_ns
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(0.3)
    finally:
        os.kill(pid, signal.SIGCONT)
    deadline = time.monotonic() + 10
    while lab.stalled_ns("a", t0, lab.now_ns) < 250_000_000 and time.monotonic() < deadline:
        time.sleep(0.02)
    t1 = lab.now_ns
    stalled = lab.stalled_ns("a", t0, t1)
    assert 250_000_000 <= stalled <= t1 - t0
    assert lab.stalled_ns("a", t0 - 10**9, t0 - 5 * 10**8) == 0
    # The meter counts a stall before its thread records it in the history.
    def long_stalls():
        return [r for r in lab.history()
                if r["kind"] == "stall" and r["data"]["late_ns"] >= 250_000_000]
    deadline = time.monotonic() + 10  # its own: the wait above may have used the last one
    while not long_stalls() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert long_stalls(), "the stall was measured but not recorded in the history"
    with pytest.raises(Exception, match="no host"):
        lab.stalled_ns("b", t0, t1)


def test_engine_errors_come_back_with_errno_and_verb(agent):
    lab = agent.new_lab(1, "a", {})
    from rdmalab import Error
    with pytest.raises(Error) as e:
        lab.host("nope")
    assert e.value.errno == 2 and "no host nope" in str(e.value)


def test_agent_thread_calls_controller_while_a_request_blocks_on_it(agent):
    """A C++ event thread of the agent runs a controller handler while the controller's request
    (Dispatcher.stop) waits for that handler: the agent must still read the controller's reply.
    (RPyC alone dispatches requests holding its receive lock: this deadlocked.)"""
    agent.conn.execute(
        "import threading\n"
        "def run_and_join(cb):\n"
        "    t = threading.Thread(target=cb)\n"
        "    t.start()\n"
        "    t.join(10)\n"
        "    return not t.is_alive()\n")
    called = []
    t0 = time.monotonic()
    assert agent.conn.namespace["run_and_join"](lambda: called.append(1)), \
        "the agent's thread could not call the controller while a request waited on it"
    assert called == [1] and time.monotonic() - t0 < 5


def test_callbacks_run_in_the_controller(agent):
    seen = []
    mapped = agent.module("builtins").list(agent.module("builtins").map(
        lambda x: seen.append(x) or x * 2, [1, 2, 3]))
    assert list(mapped) == [2, 4, 6] and seen == [1, 2, 3]


def test_endpoint_values_round_trip():
    from rdmalab import _core
    from rdmalab.api import stack
    ep = _core.Endpoint()
    ep.qp_num, ep.psn, ep.lid, ep.port_num = 17, 0x100, 3, 1
    values = stack.endpoint_values(ep)
    back = stack.as_endpoint(values)
    assert (back.qp_num, back.psn, back.lid, back.port_num) == (17, 0x100, 3, 1)
    assert bytes(back.gid.raw) == bytes(ep.gid.raw)


def _qemu_here(monkeypatch, why):
    """The VM lab's row as on a machine where qemu can run (why None) or cannot (why)."""
    monkeypatch.setitem(LAB_KINDS, "vm",
                        dataclasses.replace(LAB_KINDS["vm"], unavailable=lambda: why))


def test_vm_lab_option_parsing(monkeypatch):
    _qemu_here(monkeypatch, None)
    assert [s.id for s in parse_lab_option("vm")] == ["vm-rxe"]
    assert [s.id for s in parse_lab_option("vm:rxe,siw")] == ["vm-rxe", "vm-siw"]
    with pytest.raises(pytest.UsageError, match="unknown VM lab device mlx5"):
        parse_lab_option("vm:mlx5")
    ids = [s.id for s in parse_lab_options(["model:roce", "vm:rxe", "model:roce"])]
    assert ids == ["model-roce", "vm-rxe"]
    _qemu_here(monkeypatch, "no qemu here")
    with pytest.raises(pytest.UsageError, match="cannot run here: no qemu here"):
        parse_lab_option("vm:siw")


def test_cli_falls_back_to_the_model_saying_why(monkeypatch, capsys):
    _qemu_here(monkeypatch, "no qemu here")
    assert cli.usable_labs(["model:roce", "vm:rxe"]) == ["model:roce"]
    assert cli.usable_labs(["vm:siw"]) == ["model:iwarp-siw"]
    assert "no qemu here" in capsys.readouterr().err
    _qemu_here(monkeypatch, None)
    assert cli.usable_labs(["vm:rxe"]) == ["vm:rxe"]


def test_inventory_lab_option_parsing(tmp_path):
    inv = tmp_path / "two-mlx5.toml"
    inv.write_text("")
    [spec] = parse_lab_option(f"inventory:{inv}")
    assert (spec.id, spec.option) == ("inventory-two-mlx5", f"inventory:{inv}")
    with pytest.raises(pytest.UsageError, match="no inventory file"):
        parse_lab_option(f"inventory:{tmp_path / 'missing.toml'}")
    with pytest.raises(pytest.UsageError, match="give the inventory file"):
        parse_lab_option("inventory")
    with pytest.raises(pytest.UsageError, match="unknown lab 'cloud'"):
        parse_lab_option("cloud:x")
