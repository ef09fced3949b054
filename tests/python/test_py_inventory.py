"""Inventory (rdmalab.machines.inventory), SSH machines (rdmalab.machines.sshmachine) and host checks (rdmalab.machines.hostcheck).

The inventory tests check every refusal with its line and field. The machine tests run
against a real OpenSSH server: a private /usr/sbin/sshd on 127.0.0.1 started here with its own
host key and authorized_keys (as the VM lab's guests run it). They need no engine build.
"""
import json
import os
import pathlib
import shutil
import socket
import stat
import subprocess
import sys
import time

import pytest


from rdmalab.machines import hostcheck
from rdmalab.machines.inventory import InventoryError, dumps, load
from rdmalab.machines.machine import (HostFacts, Machine, MachineError, MachineUnreachable,
                                      PowerNotSupported, Result)
from rdmalab.machines.sshmachine import HostKeyError, SshMachine, inventory_machines

BASE = """\
[lab]
known_hosts = "known_hosts"
agent_dir = "/var/tmp/rdmalab-agent"

[[switch]]
name = "vmlab"
control = "/tmp/sw.ctl"

[[host]]
name = "vm1"
ssh = { user = "root", address = "127.0.0.1", port = 2222, identity = "id_ed25519", host_key_alias = "vmlab" }
device = "rxe0"
port = 1
gid_index = 1
netdev = "eth0"
data_address = "10.0.0.1"
mac = "52:54:00:12:34:01"
power = { on = "true", off = "true", cycle = "true" }
wire = { via = "switch", switch = "vmlab" }

[[host]]
name = "vm2"
ssh = { address = "127.0.0.1", port = 2223, identity = "id_ed25519" }
device = "rxe1"
gid_index = 3
netdev = "eth1"
data_address = "10.0.0.2"
wire = { via = "nft-bridge", bridge = "vm1" }
"""


@pytest.fixture
def invdir(tmp_path):
    (tmp_path / "id_ed25519").write_text("not a real key\n")
    (tmp_path / "known_hosts").write_text("")
    return tmp_path


def write(d: pathlib.Path, text: str) -> pathlib.Path:
    p = d / "inv.toml"
    p.write_text(text)
    return p


def test_load_good(invdir):
    inv = load(write(invdir, BASE))
    assert [h.name for h in inv.hosts] == ["vm1", "vm2"]
    vm1, vm2 = inv.hosts
    assert vm1.ssh.user == "root" and vm1.ssh.port == 2222 and vm1.ssh.host_key_alias == "vmlab"
    assert vm1.ssh.identity == str(invdir / "id_ed25519")
    assert vm1.facts == HostFacts("rxe0", 1, 1, "eth0", "10.0.0.1", "52:54:00:12:34:01",
                                  "switch", "vmlab", "")
    assert vm1.power.cycle == "true" and vm1.line == 9
    assert vm2.ssh.user  # the current user by default
    assert (vm2.facts.port, vm2.facts.gid_index, vm2.facts.wire, vm2.facts.wire_bridge) == \
        (1, 3, "nft-bridge", "vm1")
    assert vm2.power.on is None and vm2.ssh.host_key_alias is None
    assert inv.switches["vmlab"].control == "/tmp/sw.ctl"
    assert inv.known_hosts == invdir / "known_hosts"
    assert inv.agent_dir == "/var/tmp/rdmalab-agent"
    assert [m.name for m in inventory_machines(inv)] == ["vm1", "vm2"]
    assert isinstance(inventory_machines(inv)[0], Machine)


def test_defaults(invdir):
    text = ('[[host]]\nname = "h"\nssh = { address = "192.0.2.1" }\ndevice = "mlx5_0"\n'
            'netdev = "ens1f0np0"\ndata_address = "192.0.2.11"\n')
    inv = load(write(invdir, text))
    h = inv.hosts[0]
    assert (h.ssh.port, h.ssh.identity, h.facts.port, h.facts.gid_index, h.facts.wire) == \
        (22, None, 1, 0, "none")
    assert inv.known_hosts == pathlib.Path(os.path.expanduser("~/.ssh/known_hosts"))
    assert inv.switches == {}


# (old text in BASE, new text, the text that marks the expected line, words in the message)
CASES = {
    "gid_index type": ('gid_index = 3', 'gid_index = "one"', 'gid_index = "one"',
                       ['host "vm2": field gid_index: expected an integer >= 0, got "one"']),
    "gid_index bool": ('gid_index = 3', 'gid_index = true', 'gid_index = true',
                       ["field gid_index", "got true"]),
    "rdma port 0": ('device = "rxe1"', 'device = "rxe1"\nport = 0', 'port = 0',
                    ["field port: expected an integer >= 1, got 0"]),
    "ssh port range": ('port = 2223', 'port = 70000', 'port = 70000',
                       ["field ssh.port: expected an integer 1..65535, got 70000"]),
    "missing device": ('device = "rxe1"\n', '', ("[[host]]", 2),
                       ['host "vm2"', "field device: missing (required)"]),
    "missing netdev": ('netdev = "eth1"\n', '', ("[[host]]", 2), ["field netdev: missing"]),
    "missing data_address": ('data_address = "10.0.0.2"\n', '', ("[[host]]", 2),
                             ["field data_address: missing"]),
    "missing name": ('name = "vm2"\n', '', ("[[host]]", 2), ["host #2", "field name: missing"]),
    "missing ssh": ('ssh = { address = "127.0.0.1", port = 2223, identity = "id_ed25519" }\n',
                    '', ("[[host]]", 2), ["field ssh: missing"]),
    "missing ssh.address": ('address = "127.0.0.1", port = 2223', 'port = 2223',
                            'port = 2223', ["field ssh.address: missing"]),
    "ssh not a table": ('ssh = { address = "127.0.0.1", port = 2223, identity = "id_ed25519" }',
                        'ssh = "root@h"', 'ssh = "root@h"', ["field ssh: expected a table"]),
    "empty string": ('netdev = "eth1"', 'netdev = ""', 'netdev = ""',
                     ['field netdev: expected a non-empty string, got ""']),
    "unknown key": ('netdev = "eth1"', 'netdev = "eth1"\ncolour = "red"', 'colour',
                    ["field colour: unknown key colour; allowed: name, ssh, device"]),
    "unknown ssh key": ('port = 2223,', 'port = 2223, proxy = "jump",', 'proxy',
                        ["field ssh.proxy: unknown key proxy; allowed: user, address"]),
    "unknown power key": ('wire = { via = "nft-bridge"', 'power = { reset = "x" }\n'
                          'wire = { via = "nft-bridge"', 'reset', ["field power.reset"]),
    "unknown top key": ('[[host]]\nname = "vm1"', '[extras]\nx = 1\n\n[[host]]\nname = "vm1"',
                        '[extras]',
                        ["field extras: unknown key extras; allowed: lab, switch, host"]),
    "unknown lab key": ('agent_dir = ', 'cache = "x"\nagent_dir = ', 'cache',
                        ["[lab]: field cache: unknown key"]),
    "duplicate name": ('name = "vm2"', 'name = "vm1"', ('name = "vm1"', 2),
                       ['host "vm1": field name: duplicate host name (first on line 9)']),
    # Unique per fabric: vm2 moved behind vm1's switch with vm1's address.
    "duplicate data address": ('data_address = "10.0.0.2"\nwire = { via = "nft-bridge", bridge = "vm1" }',
                               'data_address = "10.0.0.1"\nwire = { via = "switch", switch = "vmlab" }',
                               ('data_address = "10.0.0.1"', 2),
                               ['field data_address: 10.0.0.1 is also host "vm1"\'s (line 9)']),
    "bad data address": ('data_address = "10.0.0.2"', 'data_address = "10.0.0.256"',
                         '10.0.0.256', ["field data_address: expected an IPv4 or IPv6 address"]),
    "bad mac": ('mac = "52:54:00:12:34:01"', 'mac = "52-54"', 'mac =', ["field mac"]),
    "bad name": ('name = "vm2"', 'name = "vm 2"', 'name = "vm 2"', ["field name: expected"]),
    "bad wire.via": ('wire = { via = "nft-bridge", bridge = "vm1" }', 'wire = { via = "magic" }',
                     'magic', ["field wire.via: expected one of switch, nftables, "
                               'nft-bridge, none, got "magic"']),
    "wire.switch unknown": ('wire = { via = "nft-bridge", bridge = "vm1" }',
                            'wire = { via = "switch", switch = "nosuch" }', 'nosuch',
                            ['field wire.switch: "nosuch" names no [[switch]] '
                             "(switches: vmlab)"]),
    "wire.switch missing": ('wire = { via = "nft-bridge", bridge = "vm1" }',
                            'wire = { via = "switch" }', 'wire = { via = "switch" }',
                            ['field wire.switch: missing']),
    "wire.switch without via": ('wire = { via = "nft-bridge", bridge = "vm1" }',
                                'wire = { via = "nftables", switch = "vmlab" }', 'nftables',
                                ['field wire.switch: only with via = "switch"']),
    "bridge unknown": ('bridge = "vm1"', 'bridge = "vm9"', 'vm9',
                       ['field wire.bridge: "vm9" names no [[host]] (hosts: vm1, vm2)']),
    "bridge missing": ('wire = { via = "nft-bridge", bridge = "vm1" }',
                       'wire = { via = "nft-bridge" }', 'nft-bridge', ["field wire.bridge"]),
    "bridge itself": ('bridge = "vm1"', 'bridge = "vm2"', 'bridge = "vm2"',
                      ["field wire.bridge: a host cannot be its own bridge"]),
    "identity missing": ('port = 2223, identity = "id_ed25519"',
                         'port = 2223, identity = "nokey"', 'nokey',
                         ["field ssh.identity: file", "nokey does not exist"]),
    "known_hosts missing": ('known_hosts = "known_hosts"', 'known_hosts = "nofile"', 'nofile',
                            ["[lab]: field known_hosts: file", "nofile does not exist"]),
    "agent_dir relative": ('agent_dir = "/var/tmp/rdmalab-agent"', 'agent_dir = "agent"',
                           'agent_dir', ["[lab]: field agent_dir: expected an absolute path"]),
    "switch duplicate": ('[[host]]\nname = "vm1"',
                         '[[switch]]\nname = "vmlab"\ncontrol = "/x"\n\n[[host]]\nname = "vm1"',
                         ('name = "vmlab"', 2),
                         ['switch "vmlab": field name: duplicate switch name (first on line 5)']),
    "switch without control": ('control = "/tmp/sw.ctl"\n', '', '[[switch]]',
                               ['switch "vmlab": field control: missing']),
    "password": ('netdev = "eth1"', 'netdev = "eth1"\npassword = "hunter2"', 'password',
                 ['host "vm2": field password: secrets are refused', "identity file",
                  "SSH agent"]),
    "password in ssh": ('port = 2223,', 'port = 2223, password = "x",', 'password',
                        ['host "vm2": field ssh.password: secrets are refused']),
    "passphrase in lab": ('agent_dir =', 'passphrase = "x"\nagent_dir =', 'passphrase',
                          ["[lab]: field passphrase: secrets are refused"]),
    "pass in power": ('wire = { via = "nft-bridge"', 'power = { on = "x", pass = "y" }\n'
                      'wire = { via = "nft-bridge"', 'pass =', ["field power.pass: secrets"]),
    "sudo_password": ('netdev = "eth1"', 'netdev = "eth1"\nsudo_password = "x"', 'sudo_pass',
                      ["field sudo_password: secrets are refused"]),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_refusals(invdir, case):
    old, new, marker, words = CASES[case]
    assert BASE.count(old) == 1, old
    text = BASE.replace(old, new)
    marker, nth = marker if isinstance(marker, tuple) else (marker, 1)
    line = [i + 1 for i, t in enumerate(text.splitlines()) if marker in t][nth - 1]
    p = write(invdir, text)
    with pytest.raises(InventoryError) as e:
        load(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}:{line}: "), (msg, line)
    for w in words:
        assert w in msg, (w, msg)


def test_host_must_be_an_array_of_tables(invdir):
    p = write(invdir, '[host]\nname = "h"\n')
    with pytest.raises(InventoryError, match=r"inv.toml:1: field host: write \[\[host\]\]"):
        load(p)


def test_syntax_error_names_file_line_column(invdir):
    text = BASE.replace('device = "rxe1"', "device = rxe1")
    line = text.splitlines().index("device = rxe1") + 1
    p = write(invdir, text)
    with pytest.raises(InventoryError, match=rf"^{p}:{line}:10: TOML syntax: Invalid value$"):
        load(p)


def test_no_hosts_and_no_file(invdir):
    with pytest.raises(InventoryError, match=r"inv.toml:1: no \[\[host\]\] entries"):
        load(write(invdir, '[lab]\nagent_dir = "/x"\n'))
    with pytest.raises(InventoryError, match="nothere.toml: cannot read"):
        load(invdir / "nothere.toml")


def test_subtable_and_dotted_forms_find_the_line(invdir):
    text = BASE.replace('ssh = { address = "127.0.0.1", port = 2223, identity = "id_ed25519" }\n',
                        "").replace('wire = { via = "nft-bridge", bridge = "vm1" }',
                                    'wire.via = "nft-bridge"\nwire.bridge = "vm1"\n'
                                    '[host.ssh]\naddress = "127.0.0.1"\nport = "x"\n')
    p = write(invdir, text)
    line = text.splitlines().index('port = "x"') + 1
    with pytest.raises(InventoryError, match=rf"^{p}:{line}: host \"vm2\": field ssh.port"):
        load(p)
    p = write(invdir, text.replace('port = "x"', "port = 2").replace(
        'wire.bridge = "vm1"', 'wire.bridge = "vm7"'))
    with pytest.raises(InventoryError, match=rf"^{p}:{line - 3}: .*field wire.bridge"):
        load(p)


def test_dumps_round_trip(invdir):
    hosts = [
        {"name": "vm1", "ssh": {"user": "root", "address": "127.0.0.1", "port": 2222,
                                "identity": "id_ed25519", "host_key_alias": "vmlab"},
         "device": "rxe0", "port": 1, "gid_index": 1, "netdev": "eth0",
         "data_address": "10.0.0.1", "mac": "52:54:00:12:34:01",
         "power": {"on": 'echo "on" > /tmp/x\\y', "cycle": "ipmitool -H bmc\tpower cycle"},
         "wire": {"via": "switch", "switch": "vmlab"}},
        {"name": "vm2", "ssh": {"address": "::1", "identity": str(invdir / "id_ed25519")},
         "device": "rxe0", "netdev": "eth0", "data_address": "fd00::2",
         "wire": {"via": "nft-bridge", "bridge": "vm1"}},
    ]
    text = dumps(hosts, {"vmlab": {"control": "/run/sw.ctl"}},
                 {"known_hosts": "known_hosts", "agent_dir": "/opt/rdmalab"})
    inv = load(write(invdir, text))
    vm1, vm2 = inv.hosts
    assert vm1.power.on == 'echo "on" > /tmp/x\\y'
    assert vm1.power.cycle == "ipmitool -H bmc\tpower cycle"
    assert vm1.facts.mac == "52:54:00:12:34:01" and vm1.ssh.host_key_alias == "vmlab"
    assert vm2.ssh.address == "::1" and vm2.facts.wire_bridge == "vm1"
    assert inv.switches["vmlab"].control == "/run/sw.ctl" and inv.agent_dir == "/opt/rdmalab"
    # list form of switches, and the same text again from what load() read
    again = dumps(hosts, [{"name": "vmlab", "control": "/run/sw.ctl"}],
                  {"known_hosts": "known_hosts", "agent_dir": "/opt/rdmalab"})
    assert again == text


# ---------------------------------------------------------------------------------------------
# A real sshd.

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: pathlib.Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "rdmalab-test",
                    "-f", str(path)], check=True, timeout=30)
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


class Sshd:
    def __init__(self, d: pathlib.Path):
        self.dir, self.port = d, free_port()
        self.host_pub = keygen(d / "hostkey")
        keygen(d / "id_ed25519")
        (d / "authorized_keys").write_text((d / "id_ed25519.pub").read_text())
        (d / "known_hosts").write_text(f"[127.0.0.1]:{self.port} {self.host_pub}\n"
                                       f"testalias {self.host_pub}\n")
        argv = ["/usr/sbin/sshd", "-D", "-e", "-f", "/dev/null",
                "-o", "ListenAddress=127.0.0.1", "-o", f"Port={self.port}",
                "-o", f"HostKey={d / 'hostkey'}",
                "-o", f"AuthorizedKeysFile={d / 'authorized_keys'}",
                "-o", "PasswordAuthentication=no", "-o", "KbdInteractiveAuthentication=no",
                "-o", "UsePAM=no", "-o", "PidFile=none", "-o", "StrictModes=no",
                "-o", "PermitRootLogin=prohibit-password"]
        self.log = open(d / "sshd.log", "w")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError((d / "sshd.log").read_text())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.log.close()


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    missing = [p for p in ("/usr/sbin/sshd", shutil.which("ssh"), shutil.which("ssh-keygen"))
               if not p or not os.path.exists(p)]
    if missing:
        pytest.skip("openssh-server / openssh-client not installed (apt-get install "
                    "openssh-server openssh-client)")
    if not os.path.isdir("/run/sshd"):       # sshd's privilege separation directory
        try:
            os.makedirs("/run/sshd", 0o755)
        except OSError as e:
            pytest.skip(f"sshd cannot start: /run/sshd missing and not creatable ({e})")
    try:
        s = Sshd(tmp_path_factory.mktemp("sshd"))
    except RuntimeError as e:
        pytest.skip(f"sshd cannot start: {e}")
    yield s
    s.stop()


def machine(d: pathlib.Path, sshd: Sshd, *, known_hosts=None, port=None, power=None,
            alias=None, device="testdev", name="box") -> SshMachine:
    ssh = {"user": "root", "address": "127.0.0.1", "port": port or sshd.port,
           "identity": str(sshd.dir / "id_ed25519"), "host_key_alias": alias}
    host = {"name": name, "ssh": ssh, "device": f"{device}{os.getpid()}", "gid_index": 0,
            "netdev": "lo", "data_address": "127.0.0.1", "power": power}
    kh = known_hosts or str(sshd.dir / "known_hosts")
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"{name}.toml"
    p.write_text(dumps([host], [], {"known_hosts": kh}))
    return inventory_machines(load(p))[0]


def test_run(tmp_path, sshd):
    m = machine(tmp_path, sshd)
    r = m.run("echo hi; echo oops >&2; exit 3")
    assert (r.rc, r.out, r.err, r.timed_out) == (3, "hi\n", "oops\n", False)
    assert m.run("exit 255").rc == 255          # the command's 255 is not an ssh failure
    assert m.run("[[ -n $BASH_VERSION ]] && echo bash").out == "bash\n"   # root's login shell
    assert m.run("id -u", root=True).out.strip() == "0"
    assert m.alive()
    assert m.wait_ready(10) < 10


def accepted(sshd: Sshd) -> int:
    sshd.log.flush()
    return (sshd.dir / "sshd.log").read_text().count("Accepted publickey")


def test_commands_share_one_master_connection(tmp_path, sshd):
    m = machine(tmp_path, sshd)
    assert m.run("true").rc == 0                 # may still connect by itself: master logging in
    deadline = time.monotonic() + 10
    while not (m._dir / "cm").exists():
        assert time.monotonic() < deadline, "no master connection's socket after 10 s"
        time.sleep(0.1)
    before = accepted(sshd)
    for i in range(5):
        assert m.run(f"echo {i}").out == f"{i}\n"
    m.copy_to(__file__, str(tmp_path / "copied.py"))
    assert accepted(sshd) == before, "a command logged in by itself beside the master"


def test_a_lost_master_is_replaced_and_commands_go_on(tmp_path, sshd, monkeypatch):
    monkeypatch.setattr("rdmalab.machines.sshmachine.MASTER_RETRY_S", 0.0)
    m = machine(tmp_path, sshd)
    m.run("true")
    first = m._master
    assert first is not None and first.poll() is None
    first.kill()                                 # the connection dies (host rebooted, ...)
    first.wait()
    r = m.run("echo still")                      # by itself, or over a new master
    assert (r.out, r.err) == ("still\n", "")     # no word of the dead master's socket
    assert m._master is not first and m._master.poll() is None
    deadline = time.monotonic() + 10
    while not (m._dir / "cm").exists():
        assert time.monotonic() < deadline, "the new master did not take the socket over"
        time.sleep(0.1)
    before = accepted(sshd)
    assert m.run("true").rc == 0 and accepted(sshd) == before
    m.drop_master()                              # before a power cycle
    assert m._master is None and first.poll() is not None


def test_run_timeout_kills_ssh(tmp_path, sshd):
    m = machine(tmp_path, sshd)
    r = m.run("sleep 31.25; echo never", timeout=1.5)
    assert r.timed_out and r.elapsed_s < 10 and "never" not in r.out
    # ... and the command on the host ends too (timeout(1) there), not 30 s later.
    deadline = time.monotonic() + 15
    while subprocess.run(["pgrep", "-f", "sleep 31.25"], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "the remote command outlived its timeout"
        time.sleep(0.2)


def test_root_uses_sudo_only_for_other_users(tmp_path, sshd):
    m = machine(tmp_path, sshd)
    assert m._remote("rdma link add x", True) == "rdma link add x"
    m.entry.ssh.user = "alice"
    assert m._remote("rdma link add 'x'", True) == \
        "sudo -n sh -c 'rdma link add '\"'\"'x'\"'\"''"
    assert m._remote("ls", False) == "ls"


def test_ssh_config_is_private_and_shared(tmp_path, sshd):
    m = machine(tmp_path, sshd, alias="testalias")
    cfg = m.ssh_config
    assert stat.S_IMODE(cfg.stat().st_mode) == 0o600
    assert stat.S_IMODE(cfg.parent.stat().st_mode) == 0o700
    text = cfg.read_text()
    for opt in ("BatchMode yes", "StrictHostKeyChecking yes", "IdentitiesOnly yes",
                "ConnectTimeout 10", "LogLevel ERROR", "ServerAliveInterval 5",
                "ServerAliveCountMax 3", "HostKeyAlias testalias",
                f'UserKnownHostsFile "{sshd.dir / "known_hosts"}"'):
        assert opt in text, opt
    assert m.ssh_argv() == ["ssh", "-F", str(cfg), "box"]
    r = subprocess.run(m.ssh_argv() + ["echo via-argv"], capture_output=True, text=True,
                       timeout=30)
    assert r.stdout == "via-argv\n", r.stderr
    assert m.run("true").rc == 0                # the alias's known_hosts line is used


def test_copy_tree_and_back(tmp_path, sshd):
    m = machine(tmp_path, sshd)
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("alpha\n")
    (src / "sub" / "run.sh").write_text("#!/bin/sh\necho run\n")
    (src / "sub" / "run.sh").chmod(0o755)
    remote = tmp_path / "remote dir" / "agent"      # a space: quoting is exercised
    m.copy_to(str(src), str(remote))
    assert (remote / "a.txt").read_text() == "alpha\n"
    assert m.run(f"'{remote}/sub/run.sh'").out == "run\n"
    m.copy_to(str(src / "a.txt"), str(tmp_path / "one" / "b.txt"))
    assert (tmp_path / "one" / "b.txt").read_text() == "alpha\n"
    back = tmp_path / "back" / "run.sh"
    m.copy_from(str(remote / "sub" / "run.sh"), str(back))
    assert back.read_text() == "#!/bin/sh\necho run\n"
    with pytest.raises(MachineError, match="box: copy box:/nonexistent"):
        m.copy_from("/nonexistent", str(tmp_path / "x"))
    assert not (tmp_path / "x").exists() and not (tmp_path / "x.part").exists()
    with pytest.raises(MachineError, match="does not exist"):
        m.copy_to(str(tmp_path / "nothing"), "/tmp/x")


def test_execnet_gateway(tmp_path, sshd):
    execnet = pytest.importorskip("execnet", reason="python3-execnet not installed")
    m = machine(tmp_path, sshd)
    gw = execnet.makegateway(m.execnet_spec())
    try:
        assert gw.remote_exec("channel.send(1 + 1)").receive(timeout=60) == 2
    finally:
        gw.exit()


def test_unknown_host_key_refused(tmp_path, sshd):
    kh = tmp_path / "empty_known_hosts"
    kh.write_text("")
    m = machine(tmp_path, sshd, known_hosts=str(kh))
    with pytest.raises(HostKeyError) as e:
        m.run("true")
    msg = str(e.value)
    assert "box" in msg and str(kh) in msg and "not in" in msg
    assert "refusing" in msg and f"[127.0.0.1]:{sshd.port}" in msg
    assert kh.read_text() == ""                     # nothing was added
    t0 = time.monotonic()
    with pytest.raises(HostKeyError):               # waiting would not help: no retries
        m.wait_ready(60)
    assert time.monotonic() - t0 < 20
    assert not m.alive()


def test_changed_host_key_refused(tmp_path, sshd):
    kh = tmp_path / "kh"
    kh.write_text(f"testalias {keygen(tmp_path / 'otherkey')}\n")
    m = machine(tmp_path, sshd, known_hosts=str(kh), alias="testalias")
    with pytest.raises(HostKeyError) as e:
        m.run("true")
    msg = str(e.value)
    assert "CHANGED" in msg and str(kh) in msg and "box" in msg and "ssh-keygen -R" in msg


def test_unreachable(tmp_path, sshd):
    port = free_port()
    m = machine(tmp_path, sshd, port=port, name="gone")
    with pytest.raises(MachineUnreachable) as e:
        m.run("true")
    msg = str(e.value)
    assert "gone" in msg and "127.0.0.1" in msg and str(port) in msg
    assert "Connection refused" in msg
    assert not m.alive()
    with pytest.raises(MachineUnreachable, match="gone"):
        m.wait_ready(2)
    with pytest.raises(MachineUnreachable):
        m.copy_to(__file__, "/tmp/x")


def test_unreachable_lists_each_host_and_why_within_the_deadline(tmp_path, sshd):
    """rdmalab.machines.sshmachine.unreachable: every host tried once, at once; the plugin refuses an
    inventory with such hosts before any scenario (test_py_plugin)."""
    from rdmalab.machines.sshmachine import unreachable
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    changed = tmp_path / "changed_known_hosts"
    changed.write_text(f"testalias {keygen(tmp_path / 'otherkey')}\n")
    mute = socket.socket()          # accepts the connection, never says a word
    mute.bind(("127.0.0.1", 0))
    mute.listen(8)
    try:
        ms = [machine(tmp_path / "ok", sshd, name="ok"),
              machine(tmp_path / "gone", sshd, port=free_port(), name="gone"),
              machine(tmp_path / "unknown", sshd, known_hosts=str(empty), name="unknown"),
              machine(tmp_path / "changed", sshd, known_hosts=str(changed), alias="testalias",
                      name="changed"),
              machine(tmp_path / "mute", sshd, port=mute.getsockname()[1], name="mute")]
        t0 = time.monotonic()
        got = dict((m.name, why) for m, why in unreachable(ms, deadline_s=12.0))
        took = time.monotonic() - t0
    finally:
        mute.close()
    assert took < 16, took                         # at once, within the deadline
    assert list(got) == ["gone", "unknown", "changed", "mute"], got
    assert "unreachable" in got["gone"] and "Connection refused" in got["gone"]
    assert "not in" in got["unknown"] and str(empty) in got["unknown"]
    assert "CHANGED" in got["changed"]
    # ssh's ConnectTimeout (10 s) covers the banner exchange, else the deadline ends it
    assert "no answer within 12 s" in got["mute"] or "timed out" in got["mute"], got["mute"]


def test_power(tmp_path, sshd):
    f = {k: tmp_path / k for k in ("on", "off", "cycle")}
    m = machine(tmp_path, sshd, power={k: f"touch {v}" for k, v in f.items()})
    assert m.can_power
    m.power_off()
    m.power_on()
    m.power_cycle()
    assert all(v.exists() for v in f.values())
    for v in f.values():
        v.unlink()
    # cycle falls back to off + on; the commands see which host they are for
    m = machine(tmp_path, sshd, power={"off": f"touch {f['off']}",
                                       "on": f'echo "$RDMALAB_HOST" > {f["on"]}'})
    assert m.can_power
    m.power_cycle()
    assert f["off"].exists() and f["on"].read_text() == "box\n"
    m = machine(tmp_path, sshd, power={"on": "echo bmc says no; exit 2"})
    assert not m.can_power
    with pytest.raises(MachineError, match=r"(?s)power on command failed \(rc 2\).*bmc says no"):
        m.power_on()
    with pytest.raises(PowerNotSupported, match="box: no power.off"):
        m.power_off()
    with pytest.raises(PowerNotSupported, match="power.cycle"):
        m.power_cycle()
    m = machine(tmp_path, sshd)
    assert not m.can_power
    with pytest.raises(PowerNotSupported):
        m.power_on()


# ---------------------------------------------------------------------------------------------
# Host lock and health.

@pytest.fixture
def lockdev():
    yield "locktest"
    for p in pathlib.Path(hostcheck.LOCK_DIR).glob(f"rdmalab-locktest{os.getpid()}-*"):
        p.unlink(missing_ok=True)


def test_host_lock(tmp_path, sshd, lockdev):
    a = machine(tmp_path / "a", sshd, device=lockdev)
    b = machine(tmp_path / "b", sshd, device=lockdev, name="box-again")
    first = hostcheck.HostLock(a).acquire(30)
    assert first.held
    second = hostcheck.HostLock(b)
    with pytest.raises(MachineError) as e:
        second.acquire(30)
    msg = str(e.value)
    assert "box-again" in msg and "held by another rdmalab run" in msg
    assert f"pid {os.getpid()}" in msg                # who holds it
    first.release()
    assert not first.held
    with second.acquire(30):
        assert second.held
    assert not second.held
    # A controller that dies (its ssh killed) releases the lock on the host.
    third = hostcheck.HostLock(a).acquire(30)
    third._proc.kill()
    deadline = time.monotonic() + 15
    while True:
        try:
            hostcheck.HostLock(b).acquire(30).release()
            break
        except MachineError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    third.release()


def test_host_lock_unreachable(tmp_path, sshd, lockdev):
    m = machine(tmp_path, sshd, device=lockdev, port=free_port(), name="gone")
    with pytest.raises(MachineUnreachable, match="gone: cannot take the lock"):
        hostcheck.HostLock(m).acquire(30)


def test_host_lock_other_port_is_free(tmp_path, sshd, lockdev):
    a = machine(tmp_path / "a", sshd, device=lockdev)
    b = machine(tmp_path / "b", sshd, device=lockdev)
    b.facts.port = 2
    with hostcheck.HostLock(a).acquire(30), hostcheck.HostLock(b).acquire(30):
        pass


def test_health_check_over_ssh_finds_no_device(tmp_path, sshd):
    m = machine(tmp_path, sshd)
    problems = hostcheck.health_check(m)
    assert len(problems) == 1, problems
    assert f"box: RDMA device testdev{os.getpid()} not found" in problems[0]
    before = hostcheck.probe(m)
    assert hostcheck.leaks(m, before) == []


class LocalMachine:
    """Runs commands here, with a fake `rdma` first on PATH (the health snippet's parsing)."""
    name = "local"

    def __init__(self, facts: HostFacts, path: str):
        self.facts, self.path = facts, path

    def run(self, cmd: str, timeout: float = 60.0, *, root: bool = False) -> Result:
        env = dict(os.environ, PATH=self.path)
        r = subprocess.run(["/bin/sh", "-c", cmd], capture_output=True, text=True,
                           timeout=timeout, env=env)
        return Result(r.returncode, r.stdout, r.stderr, False, 0.0)


@pytest.fixture
def fakehost(tmp_path):
    sysfs = tmp_path / "sys"
    port = sysfs / "class/infiniband/mlx5_0/ports/1"
    (port / "gids").mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "gids/3").write_text("0000:0000:0000:0000:0000:ffff:0a00:0001\n")
    (port / "gids/0").write_text("0000:0000:0000:0000:0000:0000:0000:0000\n")
    (sysfs / "class/net/ens1f0np0").mkdir(parents=True)
    # A process whose command line says rdmalab, one that does not.
    ours = subprocess.Popen(["/bin/sh", "-c", "sleep 60", "rdmalab-agent"])
    theirs = subprocess.Popen(["sleep", "60"])
    entries = {
        "qp": [{"ifname": "mlx5_0", "port": 1, "lqpn": 1, "comm": "[ib_core]"},
               {"ifname": "mlx5_0", "port": 1, "lqpn": 17, "pid": ours.pid, "comm": "python3"},
               {"ifname": "mlx5_0", "port": 1, "lqpn": 18, "pid": theirs.pid, "comm": "sleep"},
               {"ifname": "mlx5_1", "port": 1, "lqpn": 19, "pid": ours.pid, "comm": "python3"}],
        "cq": [{"ifname": "mlx5_0", "cqn": 5, "pid": 999999, "comm": "rdmalab-agent"}],
    }
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (tmp_path / "res.json").write_text(json.dumps(entries))
    (bindir / "rdma").write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"e = json.load(open({str(tmp_path / 'res.json')!r}))\n"
        "kind = sys.argv[-1]\n"
        "if kind == 'srq': sys.exit('rdma: unknown object srq')\n"
        "print(json.dumps(e.get(kind, [])))\n")
    (bindir / "rdma").chmod(0o755)
    path = f"{bindir}:{os.path.dirname(sys.executable)}:/usr/bin:/bin"
    yield sysfs, path, tmp_path / "res.json"
    for p in (ours, theirs):
        p.kill()
        p.wait()


def test_health_snippet_reads_sysfs_and_rdma_res(fakehost):
    sysfs, path, res = fakehost
    facts = HostFacts("mlx5_0", 1, 3, "ens1f0np0", "10.0.0.1")
    m = LocalMachine(facts, path)
    state = hostcheck.probe(m, sysfs=str(sysfs))
    assert state.checks == []
    kinds = sorted((e["kind"], e["id"]) for e in state.leftovers)
    assert kinds == [("cq", 5), ("qp", 17)]           # by cmdline, and by comm of a dead pid
    problems = state.problems
    assert any("left over from rdmalab on mlx5_0: qp 17" in p and "rdmalab-agent" in p
               for p in problems), problems
    assert any("cq 5 (pid 999999 rdmalab-agent)" in p for p in problems), problems

    # After a run: only what is new counts.
    data = json.loads(res.read_text())
    data["qp"].append(dict(data["qp"][1], lqpn=40))
    res.write_text(json.dumps(data))
    new = hostcheck.leaks(m, state)
    assert len(new) == 1 and "qp 40" in new[0] and "qp 17" not in new[0], new

    # Port down, GID empty, netdev gone.
    (sysfs / "class/infiniband/mlx5_0/ports/1/state").write_text("1: DOWN\n")
    bad = LocalMachine(HostFacts("mlx5_0", 1, 0, "ens9", "10.0.0.1"), path)
    checks = hostcheck.probe(bad, sysfs=str(sysfs)).checks
    assert any("mlx5_0 port 1 is DOWN, not ACTIVE" in c for c in checks), checks
    assert any("no GID at index 0 (all zeros)" in c for c in checks), checks
    assert any("netdev ens9 not found" in c for c in checks), checks
    assert hostcheck.leaks(bad, hostcheck.probe(bad, sysfs=str(sysfs))) == []
    missing_port = LocalMachine(HostFacts("mlx5_0", 2, 0, "ens9"), path)
    assert "mlx5_0 port 2 does not exist" in \
        hostcheck.probe(missing_port, sysfs=str(sysfs)).checks[0]
    other = LocalMachine(HostFacts("rxe0"), path)
    assert hostcheck.health_check(other) == [] or \
        "RDMA device rxe0 not found" in hostcheck.health_check(other)[0]


def test_health_check_without_python(tmp_path):
    m = LocalMachine(HostFacts("mlx5_0"), str(tmp_path))     # no python3 on PATH
    problems = hostcheck.health_check(m)
    assert len(problems) == 1 and "could not run" in problems[0] and "python3" in problems[0]


def test_a_path_too_long_for_the_filesystem_is_refused_by_field(invdir):
    """Found by tests/swarm/test_input_fuzz.py: an identity path longer than NAME_MAX was an
    OSError traceback out of pathlib, not a refusal naming the field."""
    text = BASE.replace('identity = "id_ed25519", host_key_alias', 'identity = "' + "x" * 300
                        + '", host_key_alias')
    with pytest.raises(InventoryError, match=r"field ssh.identity: file .*File name too long"):
        load(write(invdir, text))
