"""How an inventory run chooses its hosts (rdmalab.machines.inventory.fleet): free and healthy
ones, all behind one switch, pytest-xdist workers starting at different fabrics, and a clear
error naming every host passed over. The locks and health checks are replaced by fakes here
(tests/python/test_py_inventory.py runs the real ones against an sshd; make test-vm on VMs)."""
from __future__ import annotations

import pytest

from rdmalab.labs import agent as agentlab
from rdmalab.machines import hostcheck, inventory
from rdmalab.machines.inventory.fleet import inventory_fleet
from rdmalab.machines.machine import MachineError, Result

HELD: set[str] = set()


class FakeLock:
    def __init__(self, machine):
        self.machine = machine

    def acquire(self, deadline_s=30.0):
        if self.machine.name in HELD:
            raise MachineError(f"{self.machine.name}: rxe0 port 1 is held by another rdmalab run")
        HELD.add(self.machine.name)
        return self

    def release(self):
        HELD.discard(self.machine.name)


@pytest.fixture
def four(tmp_path, monkeypatch):
    key = tmp_path / "id"
    key.write_text("key")
    hosts = [{"name": f"{sw}-vm{i}", "ssh": {"address": "127.0.0.1", "port": 2200 + n,
                                             "identity": str(key)},
              "device": "rxe0", "netdev": "eth0", "data_address": f"10.0.0.{i}",  # per fabric
              "wire": {"via": "switch", "switch": sw}}
             for n, sw in enumerate(("s1", "s2")) for i in (1, 2)]
    path = tmp_path / "four.toml"
    path.write_text(inventory.dumps(hosts, {"s1": {"control": str(tmp_path / "s1.ctl")},
                                            "s2": {"control": str(tmp_path / "s2.ctl")}}))
    HELD.clear()
    monkeypatch.setattr(hostcheck, "HostLock", FakeLock)
    monkeypatch.setattr(hostcheck, "health_check", lambda m: [] if m.name != "sick" else ["x"])
    return path


def names(fleet):
    return [m.name for m in fleet.machines]


def test_each_worker_takes_two_hosts_of_one_fabric(four, monkeypatch):
    path = four
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    b = inventory_fleet(str(path), 2)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    a = inventory_fleet(str(path), 2)
    assert (names(a), names(b)) == (["s1-vm1", "s1-vm2"], ["s2-vm1", "s2-vm2"])
    assert (a.switch_control, b.switch_control) == (
        str(path.parent / "s1.ctl"), str(path.parent / "s2.ctl"))
    with pytest.raises(RuntimeError) as e:  # a third run finds both switches in use
        inventory_fleet(str(path), 2)
    assert "switch 's1' is used by another rdmalab run" in str(e.value)
    assert "switch 's2' is used by another rdmalab run" in str(e.value)
    a.owner.close()  # the first run ends: its switch and hosts are free again
    assert names(inventory_fleet(str(path), 2)) == ["s1-vm1", "s1-vm2"]


def test_hosts_held_outside_a_free_switch_are_passed_over(four, monkeypatch):
    path = four
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    HELD.update({"s1-vm1", "s1-vm2"})  # another run's lock on the hosts themselves
    fleet = inventory_fleet(str(path), 2)
    assert names(fleet) == ["s2-vm1", "s2-vm2"]
    fleet.owner.close()  # the switch's lock file with it


def test_a_fabric_with_too_few_free_hosts_is_left_whole(four, monkeypatch):
    path = four
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    HELD.add("s1-vm2")
    fleet = inventory_fleet(str(path), 2)
    assert names(fleet) == ["s2-vm1", "s2-vm2"]
    assert HELD == {"s1-vm2", "s2-vm1", "s2-vm2"}  # s1-vm1 was taken and given back
    fleet.owner.close()
    assert HELD == {"s1-vm2"}
    with pytest.raises(RuntimeError, match="3 hosts wanted on one fabric"):
        inventory_fleet(str(path), 3)
    assert HELD == {"s1-vm2"}  # nothing kept by the failed attempt
    fleet = inventory_fleet(str(path), 2)
    assert names(fleet) == ["s2-vm1", "s2-vm2"]
    fleet.owner.close()


def test_a_device_bound_adds_the_stall_each_host_measured_never_a_guess():
    """cm_timing on an agent lab (its tolerance_ns and timer_slack_ns): a span through several
    hosts may be late by the time each stood still in it (their StallMeters, summed), and the
    failure message says how long each did; with no stall the bound is the same as before."""
    from rdmalab.api.cm_timing import (early_bound_ns, late_bound_ns, late_span_bound_ns,
                                       stalled_ns, stood_still)

    stalls = {"a": [(1_000, 1_500)], "b": [(1_200, 2_000), (9_000, 9_100)]}

    class Lab:
        tolerance_ns = agentlab.AgentLab.tolerance_ns
        timer_slack_ns = agentlab.AgentLab.timer_slack_ns

        def stalled_ns(self, host, start, end):
            return sum(max(0, min(end, hi) - max(start, lo)) for lo, hi in stalls[host])

    lab = Lab()
    assert stalled_ns(lab, "a", 0, 5_000) == 500 and stalled_ns(lab, ("a", "b"), 0, 5_000) == 1_300
    assert late_span_bound_ns(lab, ("a", "b"), 0, 5_000, 10) == 10 + lab.tolerance_ns + 1_300
    assert late_span_bound_ns(lab, "b", 3_000, 5_000, 10) == 10 + lab.tolerance_ns  # none there
    assert late_bound_ns(lab, "b", 0, 10_000, 10, timers=2) == 10 + 2 * lab.timer_slack_ns + 900
    assert late_bound_ns(lab, "a", 0, 5_000, 10) == 10 + lab.timer_slack_ns + 500  # as before
    # A span from an event read late is short by the stall before the read, and only that one.
    assert early_bound_ns(lab, "b", 2_500, 10**6, 2_000) == 10**6 - lab.timer_slack_ns - 800
    assert early_bound_ns(lab, "b", 1_200, 10**6, 1_000) == 10**6 - lab.timer_slack_ns
    assert stood_still(lab, ("a", "b"), 0, 5_000) == \
        "host a stood still 0.0 ms, host b stood still 0.0 ms"  # 500 ns, 800 ns: ms shown
    stalls["a"] = [(0, 740_200_000)]
    assert stood_still(lab, "a", 0, 10**9) == "host a stood still 740.2 ms"


class _NeighMachine:
    """A machine whose `ip neigh` answers from a table: what warm_data_path runs there."""

    def __init__(self, name: str, address: str, state: str):
        self.name, self.state, self.commands = name, state, []
        self.facts = type("Facts", (), {"data_address": address, "netdev": "eth0"})()

    def run(self, cmd: str, timeout: float):
        self.commands.append(cmd)
        return type("Result", (), {"out": f"10.0.0.x dev eth0 lladdr 52:54:00:00:00:01 "
                                          f"{self.state}\n"})()


def _pool(*machines) -> agentlab.AgentPool:
    pool = agentlab.AgentPool.__new__(agentlab.AgentPool)  # no agents: only the warm-up
    pool.machines, pool.neighbours_unsure = list(machines), True
    return pool


def test_a_warm_up_of_every_machine_clears_the_neighbours_unsure_mark():
    a, b = _NeighMachine("vm1", "10.0.0.1", "STALE"), _NeighMachine("vm2", "10.0.0.2", "DELAY")
    pool = _pool(a, b)
    pool.warm_data_path([b])  # a restarted machine only: a's entry for it is not looked at
    assert pool.neighbours_unsure and a.commands == [] and "10.0.0.1" in b.commands[0]
    pool.warm_data_path()
    assert not pool.neighbours_unsure and "10.0.0.2" in a.commands[0]


def test_a_neighbour_that_never_resolves_is_a_hung_warm_up_not_a_cleared_mark():
    a, b = _NeighMachine("vm1", "10.0.0.1", "FAILED"), _NeighMachine("vm2", "10.0.0.2", "STALE")
    pool = _pool(a, b)
    with pytest.raises(agentlab.Hung, match="vm1 cannot resolve 10.0.0.2"):
        pool.warm_data_path(deadline_s=0.0)
    assert pool.neighbours_unsure


def test_a_device_that_cannot_be_deleted_makes_fresh_hosts_reboot_the_host():
    """fresh_hosts' `rdma link delete` failing (a kernel ULP holding the device: ib_srp's
    removal waiting for I/O an earlier fault left hanging) is not the scenario's failure: the
    host is rebooted instead, and a device_readd_failed record says why."""
    class Machine:
        name = "vm2"
        facts = type("Facts", (), {"device": "rxe0"})()

        def run(self, cmd: str, timeout: float, root: bool = False):
            assert cmd == "rdma link delete rxe0"
            return Result(rc=-9, out="", err="", timed_out=True, elapsed_s=timeout)

    lab = agentlab.AgentLab.__new__(agentlab.AgentLab)  # no agents: only the re-add
    lab._machines = {"b": Machine()}
    records, rebooted = [], []
    lab.free_devices = lambda *names: None
    lab.record = lambda kind, **data: records.append((kind, data))
    lab.reboot_host = lambda name, down_ns: rebooted.append((name, down_ns))
    lab._readd_device("b")
    assert rebooted == [("b", 0)]
    assert records == [("device_readd_failed", {"object": "host", "host": "b", "machine": "vm2",
                                                "device": "rxe0", "rc": -9, "timed_out": True,
                                                "err": ""})]
