"""The soft-RoCE VM lab's parts that need no VM: initrd archive, module order, switch,
qemu command line, guest agent. Booting is covered by `python3 -m rdmalab.machines.vmlab selftest`
(and by test_boot_two_vms_rxe below when VMLAB_BOOT=1)."""

import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

from rdmalab.machines.vmlab import agent, debian, initrd, kernel, modules, pcap, switch
from rdmalab.machines.vmlab.vm import Vm, VmSpec

DEADLINE_S = 10.0


def parse_newc(blob: bytes) -> dict:
    """name -> (mode, data, rdevmajor, rdevminor); asserts the format's alignment rules."""
    entries, pos = {}, 0
    while True:
        assert blob[pos:pos + 6] == b"070701", f"bad magic at {pos}"
        f = [int(blob[pos + 6 + 8 * i:pos + 14 + 8 * i], 16) for i in range(13)]
        mode, size, rmaj, rmin, namesize = f[1], f[6], f[9], f[10], f[11]
        name = blob[pos + 110:pos + 110 + namesize - 1].decode()
        assert blob[pos + 110 + namesize - 1] == 0
        pos += 110 + namesize
        pos += -pos % 4
        data = blob[pos:pos + size]
        pos += size
        pos += -pos % 4
        if name == "TRAILER!!!":
            assert pos == len(blob)
            return entries
        entries[name] = (mode, data, rmaj, rmin)


def test_initrd_archive_holds_init_busybox_console_and_ordered_modules():
    mods = [("virtio", b"\x7fELF-a"), ("virtio_pci", b"\x7fELF-bb"), ("siw", b"\x7fELF-ccc")]
    e = parse_newc(initrd.archive(mods, b"BUSYBOX", b"#!/bin/sh\n"))
    assert e["init"][0] == 0o100755 and e["init"][1] == b"#!/bin/sh\n"
    assert e["bin/busybox"][0] == 0o100755 and e["bin/busybox"][1] == b"BUSYBOX"
    assert e["bin/sh"][0] & 0o170000 == 0o120000 and e["bin/sh"][1] == b"busybox"
    assert e["dev/console"][0] & 0o170000 == 0o020000 and e["dev/console"][2:] == (5, 1)
    assert e["modules/order"][1] == b"virtio\nvirtio_pci\nsiw\n"
    assert e["modules/virtio_pci.ko"][1] == b"\x7fELF-bb"
    assert all(e[d][0] & 0o170000 == 0o040000 for d in initrd.DIRS)


def test_initrd_archive_is_reproducible():
    mods = [("a", b"1"), ("b", b"22")]
    assert initrd.archive(mods, b"x", b"y") == initrd.archive(mods, b"x", b"y")


def test_load_order_puts_dependencies_first_once_each():
    deps = {"rdma_rxe": ["ib_uverbs", "ib_core", "udp_tunnel"], "ib_uverbs": ["ib_core"],
            "ib_core": [], "udp_tunnel": [], "rdma_ucm": ["rdma_cm", "ib_core"],
            "rdma_cm": ["ib_core", "iw_cm"], "iw_cm": ["ib_core"]}
    order = modules.load_order(["rdma-rxe", "rdma_ucm"], lambda n: deps[n])
    assert order == ["ib_core", "ib_uverbs", "udp_tunnel", "rdma_rxe", "iw_cm", "rdma_cm",
                     "rdma_ucm"]


def test_load_order_reports_a_cycle():
    deps = {"a": ["b"], "b": ["c"], "c": ["a"]}
    with pytest.raises(kernel.KernelError, match="a -> b -> c -> a"):
        modules.load_order(["a"], lambda n: deps[n])


def frame(dst: str, src: str, payload: bytes = b"x" * 50) -> bytes:
    return bytes.fromhex(dst.replace(":", "")) + bytes.fromhex(src.replace(":", "")) + \
        b"\x08\x00" + payload


MAC_A, MAC_B, BCAST = "52:54:00:12:34:01", "52:54:00:12:34:02", "ff:ff:ff:ff:ff:ff"


def test_switch_floods_unknown_then_forwards_learned_unicast():
    sw = switch.Switch(peers=["/a", "/b", "/c"])
    assert sw.route(frame(MAC_B, MAC_A), "/a") == ["/b", "/c"]   # B unknown: flood
    assert sw.route(frame(MAC_A, MAC_B), "/b") == ["/a"]         # A learned from /a
    assert sw.route(frame(MAC_B, MAC_A), "/a") == ["/b"]         # B learned from /b
    assert sw.route(frame(BCAST, MAC_A), "/a") == ["/b", "/c"]   # broadcast: everyone else


def test_switch_never_sends_back_and_drops_malformed():
    sw = switch.Switch()
    assert sw.route(frame(MAC_B, MAC_A), "/a") == []             # nobody else known
    sw.route(frame(MAC_A, MAC_B), "/b")
    assert sw.route(frame(MAC_A, MAC_A), "/a") == []             # destination is the sender
    assert sw.route(b"\x01\x02\x03", "/a") == []
    assert sw.route(frame(MAC_A, MAC_B), "") == []                # unbound sender
    assert sw.dropped == 2


def test_switch_does_not_learn_a_multicast_source():
    sw = switch.Switch(peers=["/a", "/b"])
    sw.route(frame(MAC_B, "01:00:5e:00:00:01"), "/a")
    assert sw.route(frame("01:00:5e:00:00:01", MAC_B), "/b") == ["/a"]
    assert b"\x01\x00\x5e\x00\x00\x01" not in sw.table


def _bound(path: pathlib.Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(str(path))
    s.settimeout(DEADLINE_S)
    return s


def test_switch_process_carries_frames_and_survives_dead_peers_and_junk(tmp_path):
    sw_path, a_path, b_path = tmp_path / "sw.sock", tmp_path / "a.sock", tmp_path / "b.sock"
    dead = tmp_path / "dead.sock"
    _bound(dead).close()  # exists but nobody reads: sendto gets ECONNREFUSED
    argv = [sys.executable, "-m", "rdmalab.machines.vmlab.switch", "--sock", str(sw_path),
            "--peer", str(a_path), "--peer", str(b_path), "--peer", str(dead),
            "--peer", str(tmp_path / "never.sock"), "--pcap", str(tmp_path / "f.pcap")]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert "listening" in proc.stdout.readline()
        a, b = _bound(a_path), _bound(b_path)
        a.sendto(b"junk", str(sw_path))
        a.sendto(frame(BCAST, MAC_A), str(sw_path))
        assert b.recv(65536) == frame(BCAST, MAC_A)
        b.sendto(frame(MAC_A, MAC_B, b"reply"), str(sw_path))
        assert a.recv(65536) == frame(MAC_A, MAC_B, b"reply")
        big = frame(MAC_B, MAC_A, bytes(range(256)) * 36)  # a 9 KB jumbo frame, unchanged
        a.sendto(big, str(sw_path))
        assert b.recv(65536) == big
        assert proc.poll() is None
        a.close(), b.close()
    finally:
        proc.terminate()
        proc.wait(timeout=DEADLINE_S)
    captured = [f for _, f in pcap.read(tmp_path / "f.pcap")]
    assert captured == [b"junk", frame(BCAST, MAC_A), frame(MAC_A, MAC_B, b"reply"), big]


def roce_frame(opcode: int, dest_qp: int, psn: int, payload: bytes) -> bytes:
    bth = bytes([opcode, 0, 0xFF, 0xFF]) + (dest_qp & 0xFFFFFF).to_bytes(4, "big") + \
        (psn & 0xFFFFFF).to_bytes(4, "big")
    udp_len = 8 + len(bth) + len(payload) + 4
    ip = bytes([0x45, 0]) + (20 + udp_len).to_bytes(2, "big") + \
        bytes([0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2])
    udp = (49152).to_bytes(2, "big") + (4791).to_bytes(2, "big") + \
        udp_len.to_bytes(2, "big") + b"\0\0"
    return frame(MAC_B, MAC_A, b"")[:12] + b"\x08\x00" + ip + udp + bth + payload + b"ICRC"


def cm_mad(attr_id: int) -> bytes:
    deth = (0x80010000).to_bytes(4, "big") + (1).to_bytes(4, "big")
    mad = bytes([1, 0x07, 2, 0x03]) + bytes(12) + attr_id.to_bytes(2, "big") + bytes(238)
    return deth + mad


def test_bth_fields_of_a_roce_frame():
    h = pcap.bth(roce_frame(0x04, 0x123456, 0xABCDEF, b"data"))  # RC SEND_ONLY
    assert (h.opcode, h.dest_qp, h.psn, h.payload) == (0x04, 0x123456, 0xABCDEF, b"dataICRC")
    assert pcap.cm_message(roce_frame(0x04, 1, 0, cm_mad(0x10))) is None  # not UD


def test_cm_messages_are_named_by_attribute_id():
    names = [pcap.cm_message(roce_frame(0x64, 1, 7, cm_mad(a))) for a in (0x10, 0x13, 0x14,
                                                                            0x15, 0x16)]
    assert names == ["REQ", "REP", "RTU", "DREQ", "DREP"]
    assert pcap.cm_message(roce_frame(0x64, 2, 7, cm_mad(0x10))) is None  # not QP 1
    assert pcap.bth(frame(MAC_B, MAC_A)) is None                          # not IPv4/UDP


def test_pcap_read_stops_at_a_torn_record(tmp_path):
    f = tmp_path / "t.pcap"
    f.write_bytes(pcap.HEADER + pcap.record(b"one", 1.5) + pcap.record(b"two", 2.0)[:-1])
    assert list(pcap.read(f)) == [(1.5, b"one")]


def _vm(tmp_path, index=1, rdma="rxe", ssh_keys=None) -> Vm:
    return Vm(VmSpec(index, rdma, ssh_keys=ssh_keys), tmp_path, tmp_path / "sw.sock",
              tmp_path / "vmlinuz", tmp_path / "initrd.gz")


def test_qemu_command_has_no_default_devices_and_a_restricted_user_net(tmp_path):
    vm = _vm(tmp_path)
    argv = vm.argv()
    assert "-nodefaults" in argv and "-no-reboot" in argv
    assert argv[argv.index("-accel") + 1] == "tcg,thread=multi"
    netdevs = [argv[i + 1] for i, a in enumerate(argv) if a == "-netdev"]
    assert len(netdevs) == 2
    user = [n for n in netdevs if n.startswith("user,")]
    assert len(user) == 1 and "restrict=on" in user[0].split(",")
    assert re.findall(r"hostfwd=([^,]*)", user[0]) == [f"tcp:127.0.0.1:{vm.port}-:7000"]
    assert "-net" not in argv and "-nic" not in argv
    assert "readonly=on" in argv[argv.index("-virtfs") + 1]


def test_the_guest_kernel_runs_no_clocksource_watchdog(tmp_path):
    """tsc=reliable: a guest that stood still must not mark its TSC unstable, whose static-key
    flip a second TCG vCPU hit as an int3 Oops (docs/vmlab.md)."""
    argv = _vm(tmp_path).argv()
    assert "tsc=reliable" in argv[argv.index("-append") + 1].split()


def test_the_guest_kernel_does_not_test_its_timer_interrupt_at_boot(tmp_path):
    """no_timer_check: a starved TCG vCPU fails the IO-APIC timer test and the guest panics
    before its console comes up (docs/vmlab.md)."""
    argv = _vm(tmp_path).argv()
    assert "no_timer_check" in argv[argv.index("-append") + 1].split()


def test_sshd_gets_a_second_forward_on_loopback_only(tmp_path):
    vm = _vm(tmp_path, ssh_keys=tmp_path / "keys")
    argv = vm.argv()
    user = [argv[i + 1] for i, a in enumerate(argv) if a == "-netdev" and
            argv[i + 1].startswith("user,")][0]
    assert re.findall(r"hostfwd=([^,]*)", user) == [f"tcp:127.0.0.1:{vm.port}-:7000",
                                                    f"tcp:127.0.0.1:{vm.ssh_port}-:22"]
    assert f"vmlab.sshkeys={tmp_path / 'keys'}" in argv[argv.index("-append") + 1]


def test_two_vms_get_distinct_macs_sockets_and_ports(tmp_path):
    a, b = _vm(tmp_path, 1), _vm(tmp_path, 2)
    assert {a.spec.data_mac, a.spec.ctl_mac}.isdisjoint({b.spec.data_mac, b.spec.ctl_mac})
    assert a.sock != b.sock and a.port != b.port and a.spec.ip != b.spec.ip


def test_init_reads_only_settings_the_command_line_gives(tmp_path):
    init = (ROOT / "bindings/rdmalab/machines/vmlab/init.sh").read_text()
    append = _vm(tmp_path).argv()[_vm(tmp_path).argv().index("-append") + 1]
    wanted = set(re.findall(r"\$\(arg (\w+)\)", init))
    given = set(re.findall(r"vmlab\.(\w+)=", append))
    assert wanted and wanted == given


@pytest.mark.skipif(not shutil.which("busybox"), reason="busybox-static not installed")
def test_init_script_parses_under_busybox_sh():
    r = subprocess.run(["busybox", "sh", "-n", str(ROOT / "bindings/rdmalab/machines/vmlab/init.sh")],
                       capture_output=True, text=True, timeout=DEADLINE_S)
    assert r.returncode == 0, r.stderr


def test_agent_runs_commands_and_enforces_the_timeout():
    r = agent.handle({"op": "run", "cmd": "echo out; echo err >&2; exit 3", "timeout": 5})
    assert (r["rc"], r["out"], r["err"], r["timed_out"]) == (3, "out\n", "err\n", False)
    t = agent.handle({"op": "run", "cmd": "sleep 30", "timeout": 0.5})
    assert t["timed_out"] and t["elapsed_s"] < 5
    assert agent.handle({"op": "bogus"})["ok"] is False


def test_controller_talks_to_agent_over_tcp(tmp_path):
    vm = _vm(tmp_path)
    proc = subprocess.Popen([sys.executable, "-S", "-E", str(ROOT / "bindings/rdmalab/machines/vmlab/agent.py"),
                             "--bind", "127.0.0.1", "--port", str(vm.port)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith(agent.READY_MARKER)
        r = vm.run("echo hello; exit 2", 5)
        assert (r.rc, r.out, r.timed_out) == (2, "hello\n", False)
        with pytest.raises(Exception, match="rc 2"):
            r.check("echo")
    finally:
        proc.terminate()
        proc.wait(timeout=DEADLINE_S)


@pytest.mark.skipif(os.environ.get("VMLAB_BOOT") != "1", reason="boots VMs: set VMLAB_BOOT=1")
def test_boot_two_vms_rxe_rping_and_pingpong():
    from rdmalab.machines.vmlab import selftest
    report = selftest.run_provider("rxe", lambda _: None)
    assert report["rping"]["pings"] == selftest.RPING_COUNT
    assert report["rc_pingpong"]["iters"] == selftest.PINGPONG_ITERS
    assert not _pids_mentioning(report["workdir"])  # no qemu or switch left behind


def _pids_mentioning(text: str) -> list[int]:
    pids = []
    for p in pathlib.Path("/proc").glob("[0-9]*"):
        try:
            if text.encode() in (p / "cmdline").read_bytes():
                pids.append(int(p.name))
        except OSError:
            continue
    return pids


def test_sysctls_reach_the_command_line_and_bad_ones_are_refused(tmp_path):
    from rdmalab.machines.vmlab.vm import VmError, VmSpec, parse_sysctl
    vm = Vm(VmSpec(1, sysctl=parse_sysctl("net.ipv4.tcp_syn_retries=2, vm.x=1")),
                  tmp_path, tmp_path / "sw.sock", tmp_path / "vmlinuz", tmp_path / "initrd")
    append = vm.argv()[vm.argv().index("-append") + 1]
    assert "vmlab.sysctl=net.ipv4.tcp_syn_retries=2,vm.x=1" in append.split()
    plain = _vm(tmp_path, 2).argv()
    assert "vmlab.sysctl=none" in plain[plain.index("-append") + 1].split()
    for bad in ("tcp_syn_retries", "a=", "a=$(reboot)", "a b=1"):
        with pytest.raises(VmError, match="NAME=VALUE"):
            parse_sysctl(bad)


def test_kernel_choice_and_refusals(monkeypatch):
    """--kernel: the argument, else RDMALAB_VM_KERNEL, else VMLAB_KERNEL, else bookworm; a
    value that is neither a suite nor a Debian release is refused naming both."""
    for var in ("RDMALAB_VM_KERNEL", "VMLAB_KERNEL"):
        monkeypatch.delenv(var, raising=False)
    assert debian.kernel_choice() == "bookworm"
    monkeypatch.setenv("VMLAB_KERNEL", "6.1.0-56-amd64")
    assert debian.kernel_choice() == "6.1.0-56-amd64"
    monkeypatch.setenv("RDMALAB_VM_KERNEL", "sid")
    assert debian.kernel_choice() == "sid" and debian.kernel_choice("trixie") == "trixie"
    with pytest.raises(kernel.KernelError, match="a Debian suite .*bookworm.*6.12.117"):
        debian.resolve("latest; rm -rf /")


def test_compressed_and_builtin_modules(tmp_path):
    """Debian 13 ships .ko.xz (unpacked for busybox's insmod) and builds some modules in."""
    import lzma
    d = tmp_path / "kernel" / "net"
    d.mkdir(parents=True)
    (d / "veth.ko.xz").write_bytes(lzma.compress(b"\x7fELF veth"))
    (d / "bridge.ko").write_bytes(b"\x7fELF bridge")
    (tmp_path / "modules.builtin").write_text("kernel/lib/crc32.ko\nkernel/net/nf-tables.ko\n")
    index = modules.module_index(tmp_path)
    assert set(index) == {"veth", "bridge"}
    assert modules.module_bytes(index["veth"]) == b"\x7fELF veth"
    assert modules.module_bytes(index["bridge"]) == b"\x7fELF bridge"
    assert modules.builtin_modules(tmp_path) == {"crc32", "nf_tables"}


def test_a_boot_whose_init_prints_nothing_is_killed_and_booted_once_more(tmp_path, monkeypatch,
                                                                          capsys):
    """The first boot's console stays empty (a kernel hung in early boot): after SILENT_BOOT_S
    the guest is killed and booted again; the second boot is ready, the first's log is kept,
    and stderr says so. A second silent boot is not retried: it runs into the deadline."""
    from rdmalab.machines.vmlab import vm as vm_mod
    vm = _vm(tmp_path)
    # The boots are counted here, by the harness's starts: a fake guest killed before its
    # Python ran (a loaded machine: stress-ng and two device labs beside it) counts too.
    starts = {"n": 0, "ready_at": 2}

    def argv(self):
        starts["n"] += 1
        return [sys.executable, "-c", guest, str(self.serial_log),
                str(int(starts["n"] >= starts["ready_at"]))]
    guest = ("import pathlib, sys, time\n"
             "pathlib.Path(sys.argv[1]).touch()  # as qemu's file\n"
             "if sys.argv[2] == '1':\n"
             "    pathlib.Path(sys.argv[1]).write_text('vmlab-init: [1.0] up\\nVMLAB-READY vm1\\n')\n"
             "time.sleep(60)\n")
    monkeypatch.setattr(Vm, "argv", argv)
    monkeypatch.setattr(Vm, "_call", lambda self, req, timeout: {"ok": True})
    # Long enough for a loaded machine to start the fake guest's Python and let it write.
    monkeypatch.setattr(vm_mod, "SILENT_BOOT_S", 3.0)
    vm.start()
    try:
        assert vm.wait_ready(20.0) < 20.0
        assert starts["n"] == 2 and vm.boots == 2
        assert vm.kept_serial_log(1).exists() and vm.kept_serial_log(1).name == "serial.1.log"
        assert "init printed nothing 3 s after start" in capsys.readouterr().err
        starts["ready_at"] = 99          # never ready: one retry, then the deadline's VmTimeout
        vm.kill()
        vm.start()
        with pytest.raises(vm_mod.VmTimeout, match="not ready after 8.0 s"):
            vm.wait_ready(8.0)
        # Started once more, not twice.
        assert vm.boots == 4 and starts["n"] == 4
    finally:
        vm.kill()
