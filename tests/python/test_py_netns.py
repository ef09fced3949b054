"""bindings/rdmalab/machines/netns/: hosts as network namespaces on this kernel, driven through a LocalMachine.

Without RDMA (rdma="none": this check needs no rxe): the namespaces, their veths and bridge,
commands, execnet and nftables inside a namespace, power off/on as a crash and a rebuild, the
refusal of a second lab of one prefix, and a clean close. Skips, naming what is missing, where
this process is not root or cannot create a network namespace. Every name starts with `rlt`
and the test run's pid.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from rdmalab.machines import netns
from rdmalab.machines.localmachine import LocalMachine
from rdmalab.machines.machine import MachineError, MachineUnreachable, Result

TAG = f"rlt{os.getpid() % 1000}"


def _netns_unavailable():
    if os.geteuid() != 0:
        return "not root: network namespaces need CAP_SYS_ADMIN"
    if shutil.which("ip", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None:
        return "no ip (Debian package iproute2)"
    probe = f"{TAG}p"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"`ip netns add` fails here: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


_WHY = _netns_unavailable()
needs_netns = pytest.mark.skipif(_WHY is not None, reason=f"no network namespaces: {_WHY}")

# ICMP echo with a raw socket (root), since ping (iputils-ping) is not always installed.
_PING = r'''
import os, socket, struct, sys, time
def csum(b):
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    s = (s >> 16) + (s & 0xffff)
    return ~(s + (s >> 16)) & 0xffff
ident = os.getpid() & 0xffff
hdr = struct.pack("!BBHHH", 8, 0, 0, ident, 1) + b"rdmalab!"
pkt = hdr[:2] + struct.pack("!H", csum(hdr)) + hdr[4:]
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
s.settimeout(0.5)
end = time.time() + float(sys.argv[2])
while time.time() < end:
    s.sendto(pkt, (sys.argv[1], 0))
    try:
        while True:
            data, (src, _) = s.recvfrom(2048)
            ihl = (data[0] & 15) * 4
            echo_id = struct.unpack("!H", data[ihl + 4:ihl + 6])[0]
            if src == sys.argv[1] and data[ihl] == 0 and echo_id == ident:
                print("reply from", src); sys.exit(0)
    except socket.timeout:
        pass
print("no reply from", sys.argv[1]); sys.exit(1)
'''


def ping(machine, address: str, seconds: float = 3.0) -> Result:
    return machine.run(f"/usr/bin/python3 -c '{_PING}' {address} {seconds}", timeout=seconds + 10)


@pytest.fixture(scope="module")
def lab():
    hosts = netns.NetnsHosts(LocalMachine(), 2, "none", prefix=f"{TAG}h")
    try:
        yield hosts
    finally:
        hosts.close()


def _ours(prefix: str) -> str:
    """What exists of a prefix: namespaces and links."""
    r = LocalMachine().run("ip netns list; ip -o link show")
    return "\n".join(l for l in r.out.splitlines() if prefix in l)


# -- no root needed -----------------------------------------------------------------------


class _Outer:
    """A stand-in outer machine: its spec, and canned answers to run()."""
    name = "vm1"

    def __init__(self, spec="", out=""):
        self.spec, self.out = spec, out

    def execnet_spec(self, python="/usr/bin/python3"):
        return self.spec.format(python=python)

    def run(self, cmd, timeout=60.0, *, root=False):
        if cmd == "id -u":   # kernel_support's root check: the uid after the release
            return Result(0, self.out.split()[1] + "\n", "", False, 0.0)
        return Result(0, "\n".join(w for i, w in enumerate(self.out.split()) if i != 1), "",
                      False, 0.0)


def test_execnet_spec_wraps_the_outer_python():
    m = netns.NetnsMachine(_Outer("ssh=-F cfg vm1//python={python}"), "h", 1, ip="ip")
    assert m.execnet_spec() == "ssh=-F cfg vm1//python=ip netns exec h1 /usr/bin/python3"
    m = netns.NetnsMachine(_Outer("popen//python={python}"), "h", 2, ip="/usr/sbin/ip")
    assert m.execnet_spec("/opt/py") == "popen//python=/usr/sbin/ip netns exec h2 /opt/py"
    m = netns.NetnsMachine(_Outer("popen"), "h", 3, ip="ip")
    assert m.execnet_spec() == "popen//python=ip netns exec h3 /usr/bin/python3"
    # How execnet starts them: the popen argv is shlex-split, the ssh command one string
    # for the remote shell.
    execnet = pytest.importorskip("execnet", reason="python3-execnet is not installed")
    from execnet import gateway_io
    argv = gateway_io.popen_args(execnet.XSpec("popen//python=/usr/sbin/ip netns exec h2 /x"))
    assert argv[:5] == ["/usr/sbin/ip", "netns", "exec", "h2", "/x"]
    argv = gateway_io.ssh_args(execnet.XSpec(
        "ssh=-q -E log vm1//ssh_config=cfg//python=ip netns exec h1 /usr/bin/python3"))
    assert argv[-1].startswith("ip netns exec h1 /usr/bin/python3 -c ")
    assert argv[argv.index("-F") + 1] == "cfg" and "vm1" in argv


def test_facts_and_no_ssh():
    m = netns.NetnsMachine(_Outer(), "h", 3, rdma="rxe", subnet="10.9.8")
    f = m.facts
    assert (f.device, f.port, f.gid_index, f.netdev, f.data_address, f.mac, f.wire) == (
        "rxe3", 1, 1, "eth0", "10.9.8.3", "52:54:00:77:00:03", "nft-bridge")
    assert m.bridge_machine is m.outer and f.wire_bridge == m.outer.name
    assert netns.NetnsMachine(_Outer(), "h", 1, rdma="siw").facts.gid_index == 0
    assert netns.NetnsMachine(_Outer(), "h", 1).facts.device == ""
    assert m.can_power
    with pytest.raises(MachineError, match="no SSH target"):
        m.ssh_argv()


def test_bad_arguments():
    with pytest.raises(ValueError, match="1 to 16"):
        netns.NetnsHosts(_Outer(), 0, "none")
    with pytest.raises(ValueError, match="1 to 16"):
        netns.NetnsHosts(_Outer(), 17, "none")
    with pytest.raises(ValueError, match="rdma"):
        netns.NetnsHosts(_Outer(), 2, "mlx5")
    with pytest.raises(ValueError, match="prefix"):
        netns.NetnsHosts(_Outer(), 2, "none", prefix="rl1")   # rl1<i> would read as rl<1i>
    with pytest.raises(ValueError, match="subnet"):
        netns.NetnsHosts(_Outer(), 2, "none", subnet="10.77.0.0/24")


@pytest.mark.parametrize("out, rdma, expect", [
    ("7.2.13-amd64 0 have-ip have-rdma have-netns have-module", "rxe", None),
    ("7.1.0 0 have-ip have-rdma have-netns have-module", "siw", None),
    ("6.12.57+deb13-amd64 0 have-ip have-rdma have-netns have-module", "rxe",
     ["6.12.57+deb13-amd64", "since 7.1"]),
    ("7.2.13 0 have-ip have-netns", "rxe", ["7.2.13", "rdma missing", "rdma_rxe module"]),
    ("6.1.0 1000 have-ip have-netns", "none", ["6.1.0", "not run as root", "1000"]),
    ("6.1.0 0 have-ip have-netns", "none", None),
])
def test_kernel_support_reads_the_probe(out, rdma, expect):
    why = netns.kernel_support(_Outer(out=out.replace(" ", "\n")), rdma)
    if expect is None:
        assert why is None
    else:
        assert why is not None and all(e in why for e in expect), why


def test_kernel_support_here_names_the_release():
    release = os.uname().release
    why = netns.kernel_support(LocalMachine(), "rxe")
    if why is None:
        pytest.skip(f"this kernel ({release}) can host the netns lab with rxe")
    assert release in why and "rxe" in why


# -- on this kernel ---------------------------------------------------------------------------


@needs_netns
def test_hosts_ping_each_other(lab):
    a, b = lab.machines
    assert ping(a, b.facts.data_address).rc == 0
    r = ping(b, a.facts.data_address)
    assert r.rc == 0, r


@needs_netns
def test_run_is_inside_the_namespace(lab):
    a, b = lab.machines
    outer = LocalMachine().run("readlink /proc/self/ns/net").out.strip()
    ia = a.run("readlink /proc/self/ns/net").out.strip()
    ib = b.run("readlink /proc/self/ns/net").out.strip()
    assert ia.startswith("net:[") and len({outer, ia, ib}) == 3
    assert ia == LocalMachine().run(f"ip netns exec {a.name} readlink /proc/self/ns/net"
                                    ).out.strip()
    r = a.run("cat /sys/class/net/eth0/address; ip -4 -o addr show dev eth0")
    assert a.facts.mac in r.out and f" {a.facts.data_address}/24 " in r.out
    assert a.alive() and a.run("exit 3").rc == 3
    p = a.popen("readlink /proc/self/ns/net")
    assert p.communicate(timeout=30)[0].strip() == ia


@needs_netns
def test_execnet_gateway_runs_inside_the_namespace(lab):
    execnet = pytest.importorskip("execnet", reason="python3-execnet is not installed")
    a = lab.machines[0]
    gw = execnet.makegateway(a.execnet_spec())
    try:
        ch = gw.remote_exec("import os; channel.send(os.readlink('/proc/self/ns/net'))")
        inside = ch.receive(30)
    finally:
        gw.exit()
    assert inside == LocalMachine().run(f"ip netns exec {a.name} readlink /proc/self/ns/net"
                                        ).out.strip()
    assert inside != os.readlink("/proc/self/ns/net")


@needs_netns
@pytest.mark.skipif(shutil.which("nft", path="/usr/sbin:/sbin:/usr/bin") is None,
                    reason="no nft (Debian package nftables)")
def test_nft_tables_stay_in_their_namespace(lab):
    a, b = lab.machines
    table = f"{TAG}t"
    a.run(f"nft add table inet {table}").check("nft add table")
    try:
        assert table in a.run("nft list tables").check().out
        assert table not in b.run("nft list tables").check().out
        assert table not in LocalMachine().run("nft list tables").out
    finally:
        a.run(f"nft delete table inet {table}")


@needs_netns
def test_power_cycle_is_a_crash_and_a_rebuild(lab):
    a, b = lab.machines
    sleeper = a.popen("exec sleep 1000")
    try:
        # ip netns exec execs, so the pid is sleep's, but it enters the namespace only once
        # exec'd (the fresh clone's loaded run listed the namespace before that).
        deadline = time.monotonic() + 10
        while True:
            pids = LocalMachine().run(f"ip netns pids {a.name}").out.split()
            if str(sleeper.pid) in pids or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert str(sleeper.pid) in pids, f"sleep {sleeper.pid} not in {a.name} within 10 s"
        mac, addr = a.facts.mac, a.facts.data_address
        a.power_off()
        assert sleeper.wait(timeout=10) == -9
        assert not a.alive()
        with pytest.raises(MachineUnreachable, match="does not exist"):
            a.run("true")
        with pytest.raises(MachineUnreachable, match="not ready within"):
            a.wait_ready(0.5)
        a.power_on()
        assert a.wait_ready(30) >= 0 and a.alive()
        r = a.run("cat /sys/class/net/eth0/address; ip -4 -o addr show dev eth0")
        assert mac in r.out and f" {addr}/24 " in r.out
        assert LocalMachine().run(f"ip netns pids {a.name}").out.strip() == ""   # none came back
        assert ping(a, b.facts.data_address).rc == 0
        a.power_cycle()
        a.wait_ready(30)
        assert ping(b, addr).rc == 0
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
        sleeper.wait()


@needs_netns
def test_link_down_and_up(lab):
    a, b = lab.machines
    a.run("ip link set eth0 down").check("link down")
    try:
        assert a.run("cat /sys/class/net/eth0/operstate").out.strip() == "down"
        assert ping(a, b.facts.data_address, 1.0).rc != 0
        with pytest.raises(MachineUnreachable, match="not ready"):
            a.wait_ready(0.5)
    finally:
        a.run("ip link set eth0 up").check("link up")
    a.wait_ready(30)
    assert ping(a, b.facts.data_address).rc == 0


@needs_netns
def test_a_second_lab_of_the_same_prefix_is_refused(lab):
    with pytest.raises(MachineError, match=r"already exist: .*h1, .*h1v.*hbr") as e:
        netns.NetnsHosts(LocalMachine(), 1, "none", prefix=lab.prefix)
    assert lab.machines[0].name in str(e.value)
    assert all(m.alive() for m in lab.machines)   # the refusal touched nothing
    assert ping(lab.machines[0], lab.machines[1].facts.data_address).rc == 0


@needs_netns
def test_close_leaves_nothing_and_is_idempotent():
    prefix = f"{TAG}c"
    hosts = netns.NetnsHosts(LocalMachine(), 3, "none", prefix=prefix, subnet="10.78.1")
    try:
        assert [m.facts.data_address for m in hosts.machines] == [
            "10.78.1.1", "10.78.1.2", "10.78.1.3"]
        hosts.machines[1].power_off()             # a host that is off closes too
        hosts.machines[0].popen("exec sleep 1000")
    finally:
        hosts.close()
    assert _ours(prefix) == ""
    hosts.close()
    with pytest.raises(MachineError, match="closed"):
        hosts.machines[0].power_on()
    assert _ours(prefix) == ""


@needs_netns
def test_replace_deletes_leftovers():
    prefix = f"{TAG}r"
    local = LocalMachine()
    try:
        local.run(f"ip netns add {prefix}5 && ip link add {prefix}br type bridge").check()
        with netns.NetnsHosts(local, 1, "none", prefix=prefix, replace=True) as hosts:
            assert f"{prefix}5" not in _ours(prefix)
            assert hosts.machines[0].alive()
        assert _ours(prefix) == ""
    finally:
        local.run(f"ip netns del {prefix}5; ip link del {prefix}br")


class _FailingOuter(LocalMachine):
    """A LocalMachine whose `ip link add` of one veth fails."""

    def __init__(self, poison: str):
        super().__init__("failing")
        self.poison = poison

    def run(self, cmd, timeout=60.0, *, root=False):
        if self.poison in cmd:
            cmd = cmd.replace(self.poison, "false")
        return super().run(cmd, timeout, root=root)


@needs_netns
def test_a_failed_setup_names_host_and_step_and_cleans_up():
    prefix = f"{TAG}f"
    outer = _FailingOuter(f"ip link add {prefix}2v ")
    with pytest.raises(MachineError) as e:
        netns.NetnsHosts(outer, 3, "none", prefix=prefix)
    text = str(e.value)
    assert text.startswith(f"{prefix}2: create the veth pair: rc 1"), text
    assert _ours(prefix) == ""


# A stand-in `rdma` (and modprobe) first on PATH: this kernel has no rxe, so the device steps
# are checked by what the tool is asked, and where. A device belongs to the namespace that
# added it, and `rdma link show` names its netdev only there (as the kernel's nldev does).
_RDMA_STUB = r'''#!/bin/sh
S=@STATE@; ns=$(readlink /proc/self/ns/net)
echo "$ns $*" >> $S/log
case "$*" in
  "system show") echo "netns $(cat $S/mode) copy-on-fork on" ;;
  "system set netns "*) [ -e $S/busy ] && { echo "error: Device or resource busy" >&2; exit 1; }
                        echo "$4" > $S/mode ;;
  "dev show "*) [ -e $S/dev.$3 ] ;;
  "link add "*) [ -e $S/dev.$3 ] && exit 1; echo "$ns" > $S/dev.$3 ;;
  "link show") for d in $S/dev.*; do [ "$(cat $d 2>/dev/null)" = "$ns" ] &&
                 echo "link ${d##*/dev.}/1 state ACTIVE physical_state LINK_UP netdev eth0"; done
               exit 0 ;;
  "link delete "*) rm $S/dev.$3 ;;
esac
'''


@needs_netns
def test_device_steps_with_a_stand_in_rdma(tmp_path, monkeypatch):
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    (state / "mode").write_text("shared\n")
    (bin_dir / "rdma").write_text(_RDMA_STUB.replace("@STATE@", str(state)))
    (bin_dir / "modprobe").write_text("#!/bin/sh\nexit 0\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    outer = LocalMachine("stub", env=dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}"))
    # No /sys/class/infiniband/rxeN here: readiness is the veth's alone.
    monkeypatch.setattr(netns.NetnsMachine, "wait_ready", lambda self, deadline_s=0: 0.0)
    prefix = f"{TAG}d"
    log = state / "log"
    outer_ns = os.readlink("/proc/self/ns/net")
    with netns.NetnsHosts(outer, 2, "rxe", prefix=prefix) as hosts:
        a, b = hosts.machines
        ns_a = a.run("readlink /proc/self/ns/net").out.strip()
        assert (a.facts.device, b.facts.device) == ("rxe1", "rxe2")
        calls = log.read_text().splitlines()
        assert f"{outer_ns} system show" in calls
        assert not any("system set" in c for c in calls)       # already shared: unchanged
        assert f"{ns_a} link add rxe1 type rxe netdev eth0" in calls
        assert sorted(p.name for p in state.glob("dev.*")) == ["dev.rxe1", "dev.rxe2"]
        log.write_text("")
        a.power_cycle()
        calls = log.read_text().splitlines()
        assert f"{ns_a} link show" in calls
        assert calls.index(f"{outer_ns} link delete rxe1") < calls.index(
            next(c for c in calls if c.endswith("link add rxe1 type rxe netdev eth0")))
        assert not any("rxe2" in c for c in calls if "delete" in c)   # b's device is b's
    assert list(state.glob("dev.*")) == [] and _ours(prefix) == ""

    # Exclusive now, and the kernel refuses the change (other namespaces exist): named.
    (state / "mode").write_text("exclusive\n")
    (state / "busy").touch()
    with pytest.raises(MachineError, match="set the RDMA namespace mode to shared") as e:
        netns.NetnsHosts(outer, 1, "rxe", prefix=prefix)
    assert "Device or resource busy" in str(e.value) and _ours(prefix) == ""
    (state / "busy").unlink()
    with netns.NetnsHosts(outer, 1, "rxe", prefix=prefix):
        assert (state / "mode").read_text().strip() == "shared"
    assert _ours(prefix) == ""
