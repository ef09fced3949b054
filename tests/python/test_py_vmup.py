"""`python3 -m rdmalab.machines.vmlab up/power/down`: VM guests as machines reached by SSH alone.

Boots two rxe guests through `up` (they must not see this checkout), reaches them only with
plain ssh and the inventory it wrote, power-cycles one through the inventory's own power
command, and checks that `down` leaves no process behind. Skips only where qemu cannot run.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time
import tomllib

import pytest

from rdmalab.machines.qemu import qemu_unavailable

ROOT = pathlib.Path(__file__).resolve().parents[2]
from rdmalab.machines import inventory as inventory_mod
from rdmalab.machines.vmlab import up as up_mod

_WHY = qemu_unavailable()
# make test-vm runs up/power/down on the guests it boots anyway (tests/vm); this whole-cycle
# check boots two more and runs with VMLAB_BOOT=1.
pytestmark = [
    pytest.mark.skipif(_WHY is not None, reason=f"the VM lab cannot run here: {_WHY}"),
    pytest.mark.skipif(os.environ.get("VMLAB_BOOT") != "1", reason="boots VMs: set VMLAB_BOOT=1")]


def _vmlab(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rdmalab.machines.vmlab", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)


def _ssh(host: dict, known_hosts: str, cmd: str) -> subprocess.CompletedProcess:
    s = host["ssh"]
    return subprocess.run(
        ["ssh", "-F", "/dev/null", "-i", s["identity"], "-p", str(s["port"]),
         "-o", f"HostKeyAlias={s['host_key_alias']}", "-o", f"UserKnownHostsFile={known_hosts}",
         "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
         f"{s['user']}@{s['address']}", cmd],
        text=True, capture_output=True, timeout=60, stdin=subprocess.DEVNULL)


def test_up_writes_an_inventory_of_guests_reached_by_ssh_alone(tmp_path):
    inv = tmp_path / "inv.toml"
    t0 = time.monotonic()
    r = _vmlab("up", "--device", "rxe", "--hosts", "2", "--inventory", str(inv),
               timeout=up_mod.UP_DEADLINE_S + 30)
    try:
        assert r.returncode == 0, f"up failed:\n{r.stdout}\n{r.stderr}"
        state = pathlib.Path(json.loads(up_mod.sidecar(inv).read_text())["state"])
        up_s = time.monotonic() - t0
        doc = tomllib.loads(inv.read_text())
        assert [h.name for h in inventory_mod.load(inv).hosts] == ["vm1", "vm2"]  # its loader
        known = doc["lab"]["known_hosts"]
        hosts = {h["name"]: h for h in doc["host"]}
        assert list(hosts) == ["vm1", "vm2"]
        assert doc["switch"][0]["control"] == up_mod.read_state(state)["control"]
        vm1, vm2 = hosts["vm1"], hosts["vm2"]
        assert (vm1["device"], vm1["data_address"]) == ("rxe0", "10.0.0.1")

        probe = (f"ls -A {ROOT} | wc -l; ls -A {up_mod.AGENT_DIR} | wc -l; "
                 f"test -e {ROOT}/README.md && echo VISIBLE; ibv_devices; "
                 f"echo GID $(cat /sys/class/infiniband/rxe0/ports/1/gids/{vm1['gid_index']}); "
                 "timeout 20 rping -c -a 10.0.0.2 -C 1 >/dev/null && echo PING-OK")
        # The guests run the host's userspace, which may lack ping (iputils-ping); rping
        # (rdmacm-utils, a VM lab dependency) crosses the switch over RDMA too.
        srv = _ssh(vm2, known, "timeout 30 rping -s -a 10.0.0.2 -C 1 </dev/null >/dev/null 2>&1 &")
        assert srv.returncode == 0, srv.stderr
        p = _ssh(vm1, known, probe)
        assert p.returncode == 0, p.stderr
        lines = p.stdout.splitlines()
        assert lines[:2] == ["0", "0"] and "VISIBLE" not in lines, p.stdout  # hidden, empty
        assert "rxe0" in p.stdout, p.stdout
        assert "GID 0000:0000:0000:0000:0000:ffff:0a00:0001" in lines, p.stdout  # 10.0.0.1
        assert "PING-OK" in lines, p.stdout

        old_pid = up_mod.read_state(state)["hosts"]["vm2"]["qemu_pid"]
        t1 = time.monotonic()
        c = subprocess.run(vm2["power"]["cycle"], shell=True, text=True, capture_output=True,
                           timeout=300)
        cycle_s = time.monotonic() - t1
        assert c.returncode == 0, c.stdout + c.stderr
        assert up_mod.read_state(state)["hosts"]["vm2"]["qemu_pid"] != old_pid
        u = _ssh(vm2, known, f"cut -d. -f1 /proc/uptime; ls -A {ROOT} | wc -l")
        assert u.returncode == 0, u.stderr
        assert int(u.stdout.split()[0]) < cycle_s + 5 and u.stdout.split()[1] == "0"
        print(f"up {up_s:.1f} s, cycle {cycle_s:.1f} s")
    finally:
        if up_mod.sidecar(inv).exists():  # up succeeded: whatever failed above, stop the lab
            state = up_mod.state_of(inv)
            pids = up_mod.recorded_pids(state)
            d = _vmlab("down", "--inventory", str(inv), timeout=up_mod.DOWN_DEADLINE_S + 30)
            assert d.returncode == 0, d.stdout + d.stderr
            assert not up_mod.sidecar(inv).exists()
            assert pids and not [p for p in up_mod.recorded_pids(state) + pids
                                 if up_mod.running(p, state)]
