"""Boot and drive qemu VMs joined by the switch.

    with VmGroup(2, rdma="rxe") as lab:      # builds/reuses kernel and initrd, starts the switch
        lab.start_all(); lab.wait_all_ready()
        print(lab.vms[0].run("ibv_devices").out)

Every qemu runs with -nodefaults (no implicit NIC) under TCG. NIC 1 is the data NIC on the
switch (unix datagrams); NIC 2 is a user-mode NIC with restrict=on whose only use is two
hostfwds from 127.0.0.1: to the guest agent and to the guest's sshd. Processes are killed on
exit from the with block, at interpreter exit (atexit), and by the kernel if this process
dies (PR_SET_PDEATHSIG).
"""
from __future__ import annotations

import atexit
import ctypes
import dataclasses
import itertools
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref

from ...paths import switch_binary
from ..machine import SPARE_DISK_SERIAL, MachineError, Result  # noqa: F401  (Result: what run() returns)
from . import initrd as initrd_mod
from . import kernel as kernel_mod
from . import moddep, prepare
from . import ssh as ssh_mod

AGENT = pathlib.Path(__file__).with_name("agent.py")
READY_MARKER = "VMLAB-READY"
FAIL_MARKER = "VMLAB-FAIL"
GUEST_PORT = 7000
BOOT_DEADLINE_S = 120.0
# A guest whose init has printed nothing this long after start hung in the kernel's boot (seen
# once in a fresh clone: a 7.2 guest with 2 vCPUs printed nothing in 180 s; the next boots took
# 13-16 s, init's first line at 7 s of uptime; 47 s at most under stress-ng): it is killed and
# booted once more, with a deadline of its own. Its serial log says where the kernel stopped.
SILENT_BOOT_S = 90.0
INIT_MARKER = "vmlab-init:"
SOCK_PATH_MAX = 100  # sun_path is 108 bytes
DISK_MB = 256  # the spare disk's size (sparse)
KEEP_RUNS = 8  # run directories (logs, shares) kept under kernel.STATE/run (.cache/vmlab/run)

_live: "weakref.WeakSet[Vm]" = weakref.WeakSet()
_run_seq = itertools.count(1)


class VmError(MachineError):
    pass


class VmTimeout(VmError):
    pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    # Runs in the child before exec: SIGKILL it when the controller dies.
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def tail(path: pathlib.Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return f"({path} does not exist)"
    return "\n".join(text.splitlines()[-lines:])


def parse_sysctl(text: str) -> dict[str, str]:
    """"net.ipv4.tcp_syn_retries=2 kernel.x=1" (blanks or commas between) -> a dict; a bad
    entry is a VmError naming it."""
    out: dict[str, str] = {}
    for item in text.replace(",", " ").split():
        key, eq, value = item.partition("=")
        if not eq or not value or not key.replace(".", "").replace("_", "").isalnum() \
                or not value.replace("-", "").isalnum():
            raise VmError(f"sysctl {item!r}: expected NAME=VALUE, e.g. "
                          "net.ipv4.tcp_syn_retries=2 (letters, digits, '.', '_' in the name; "
                          "an integer or word as the value)")
        out[key] = value
    return out


def _sysctl_arg(sysctl: dict[str, str]) -> str:
    """vmlab.sysctl's value: NAME=VALUE pairs joined by commas, or none (init.sh splits them)."""
    parse_sysctl(" ".join(f"{k}={v}" for k, v in sysctl.items()))  # the same check
    return ",".join(f"{k}={v}" for k, v in sysctl.items()) or "none"


def _paths_arg(paths: list[pathlib.Path], verb: str = "hide") -> str:
    """vmlab.hide's or vmlab.keep's value: absolute paths joined by commas (the kernel command
    line splits on blanks, init.sh on commas), or none."""
    for p in paths:
        if not p.is_absolute() or any(c.isspace() or c == "," for c in str(p)):
            raise VmError(f"cannot {verb} {str(p)!r} in a guest: an absolute path without "
                          "blanks or commas is needed")
    return ",".join(str(p) for p in paths) or "none"


@dataclasses.dataclass
class VmSpec:
    index: int                  # 1-based; address 10.0.0.<index>
    rdma: str = "rxe"           # rxe | siw | none
    memory_mb: int = 512
    cpus: int = 1
    ssh_keys: pathlib.Path | None = None  # ssh.ensure_keys(); None: no sshd in the guest
    # Host paths the guest must not see (an empty tmpfs over each): e.g. the checkout, so a
    # guest is a machine the controller reaches by SSH alone. Empty: the whole host root.
    hide: list[pathlib.Path] = dataclasses.field(default_factory=list)
    # Sysctls set before the RDMA device comes up, e.g. {"net.ipv4.tcp_syn_retries": "2"}.
    sysctl: dict[str, str] = dataclasses.field(default_factory=dict)
    # Paths the guest keeps across its reboots (a folder of its own in its share), as a real
    # machine keeps /var/tmp: the agent installed there is not shipped again after a reboot
    # (~10 s of a TCG guest's CPU each time).
    keep: list[pathlib.Path] = dataclasses.field(default_factory=list)

    @property
    def name(self) -> str:
        return f"vm{self.index}"

    @property
    def ip(self) -> str:
        return f"10.0.0.{self.index}"

    @property
    def data_mac(self) -> str:
        return f"52:54:00:12:34:{self.index:02x}"

    @property
    def ctl_mac(self) -> str:
        return f"52:54:00:99:00:{self.index:02x}"


class Vm:
    def __init__(self, spec: VmSpec, workdir: pathlib.Path, switch_sock: pathlib.Path,
                 vmlinuz: pathlib.Path, initrd: pathlib.Path, release: str = "",
                 moddir: pathlib.Path | None = None) -> None:
        self.spec = spec
        self.release = release  # the kernel's, for progress lines
        self.moddir = moddir  # the guest's /lib/modules/<release> (moddep.py); None: none
        self.dir = workdir / spec.name
        self.share = self.dir / "share"
        self.sock = workdir / f"{spec.name}.sock"
        self.serial_log = self.dir / "serial.log"
        self.qemu_log = self.dir / "qemu.log"
        self.switch_sock = switch_sock
        self.vmlinuz, self.initrd = vmlinuz, initrd
        self.port = _free_port()       # 127.0.0.1 port forwarded to the agent
        self.ssh_port = _free_port()   # ... and to the guest's sshd
        self.proc: subprocess.Popen | None = None
        self.boots = 0
        self.started_at = 0.0
        self.share.mkdir(parents=True, exist_ok=True)
        self.disk = self.dir / "disk.img"
        if not self.disk.exists():
            with open(self.disk, "wb") as f:
                f.truncate(DISK_MB << 20)  # sparse: costs what is written
        if len(str(self.sock)) > SOCK_PATH_MAX:
            raise VmError(f"socket path too long for sun_path: {self.sock}")
        _live.add(self)

    def argv(self) -> list[str]:
        s = self.spec
        # loglevel=6: the kernel's boot lines on the serial console (2 kB, no slower), so that
        # a boot that hangs shows where. tsc=reliable: no clocksource watchdog (a TCG vCPU
        # that stood still 3.6 s made it see "frequency skew"; marking the TSC unstable then
        # flips sched_clock's static key by int3 text patching, which a second vCPU under
        # multi-threaded TCG hit as "Oops: int3" in sched_clock_tick and panicked: 7.2.13,
        # netns guest, fresh clone of fa478a4). The kernel's documented use in VMs.
        # no_timer_check: no test of the timer interrupt through the IO-APIC at boot, which a
        # TCG guest on a busy host fails now and then ("IO-APIC + timer doesn't work!", panic
        # before the console: 6.1.192, fresh clones of 5d076ac and 1927a49).
        append = (f"console=ttyS0 panic=-1 loglevel=6 tsc=reliable no_timer_check "
                  f"vmlab.name={s.name} "
                  f"vmlab.ip={s.ip}/24 vmlab.dmac={s.data_mac} vmlab.cmac={s.ctl_mac} "
                  f"vmlab.rdma={s.rdma} vmlab.port={GUEST_PORT} vmlab.agent={AGENT} "
                  f"vmlab.sshkeys={s.ssh_keys or 'none'} vmlab.hide={_paths_arg(s.hide)} "
                  f"vmlab.sysctl={_sysctl_arg(s.sysctl)} "
                  f"vmlab.keep={_paths_arg(s.keep, 'keep')} "
                  f"vmlab.moddir={_paths_arg([self.moddir] if self.moddir else [], 'mount')}")
        fwd = f"hostfwd=tcp:127.0.0.1:{self.port}-:{GUEST_PORT}"
        if s.ssh_keys is not None:
            fwd += f",hostfwd=tcp:127.0.0.1:{self.ssh_port}-:22"
        return [
            "qemu-system-x86_64", "-name", s.name,
            "-accel", "tcg,thread=multi", "-cpu", "max", "-m", str(s.memory_mb),
            "-smp", str(s.cpus), "-nodefaults", "-display", "none",
            "-serial", f"file:{self.serial_log}", "-monitor", "none", "-no-reboot",
            "-kernel", str(self.vmlinuz), "-initrd", str(self.initrd), "-append", append,
            "-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,"
                       "multidevs=remap",
            "-virtfs", f"local,path={self.share},mount_tag=vmlab,security_model=none,"
                       "multidevs=remap",
            "-netdev", f"dgram,id=d0,local.type=unix,local.path={self.sock},"
                       f"remote.type=unix,remote.path={self.switch_sock}",
            "-device", f"virtio-net-pci,netdev=d0,mac={s.data_mac},romfile=",
            "-netdev", f"user,id=m0,restrict=on,{fwd}",
            "-device", f"virtio-net-pci,netdev=m0,mac={s.ctl_mac},romfile=",
            # The spare disk a workload's target exports (rdmalab.workloads): a file of this
            # VM's folder, so it outlives the guest's reboots as a real disk does.
            "-drive", f"file={self.disk},if=none,id=disk0,format=raw,cache=writeback",
            "-device", f"virtio-blk-pci,drive=disk0,serial={SPARE_DISK_SERIAL}",
        ]

    # ---- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        if self.alive():
            raise VmError(f"{self.spec.name} is already running")
        if self.serial_log.exists():  # keep the previous boot's log beside the new one
            self.serial_log.replace(self.kept_serial_log(self.boots))
        self.boots += 1
        self.started_at = time.monotonic()
        with open(self.qemu_log, "ab") as log:
            self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)

    def kept_serial_log(self, boot: int) -> pathlib.Path:
        """Where boot number `boot`'s serial log is kept once the guest was started again."""
        return self.serial_log.with_suffix(f".{boot}.log")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL, as a crash: the guest gets no chance to close anything."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(timeout=30)

    def reboot(self, deadline_s: float = BOOT_DEADLINE_S) -> float:
        """Kill and boot again on the same socket path, MAC and port; returns the boot time."""
        self.kill()
        self.start()
        return self.wait_ready(deadline_s)

    def poweroff(self, deadline_s: float = 30.0) -> None:
        """Clean power-off through the agent; SIGKILL if qemu has not exited by the deadline."""
        if not self.alive():
            return
        try:
            self._call({"op": "poweroff"}, 10.0)
        except (OSError, ValueError, VmError):
            pass
        assert self.proc is not None
        try:
            self.proc.wait(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            self.kill()

    # ---- readiness and commands -----------------------------------------------------

    def diagnostic(self) -> str:
        return (f"--- {self.spec.name} serial log tail ({self.serial_log}) ---\n"
                f"{tail(self.serial_log)}\n--- qemu log ---\n{tail(self.qemu_log, 10)}")

    def wait_ready(self, deadline_s: float = BOOT_DEADLINE_S) -> float:
        """Waits for the agent's marker and a ping; returns seconds since start(). Says how
        long the boot has taken every 10 s after the first 5 (kernel_mod.waiting)."""
        what = f"{self.spec.name} booting {self.release or self.vmlinuz.name} ({self.spec.rdma})"
        with kernel_mod.waiting(what, deadline_s, started=self.started_at):
            return self._wait_ready(deadline_s)

    def _wait_ready(self, deadline_s: float) -> float:
        end = self.started_at + deadline_s
        booted_again = False
        while True:
            text = self.serial_log.read_text(errors="replace") if self.serial_log.exists() else ""
            if INIT_MARKER not in text and not booted_again and \
                    time.monotonic() - self.started_at > SILENT_BOOT_S:
                self._boot_again()
                booted_again, end = True, self.started_at + deadline_s
                continue
            if FAIL_MARKER in text:
                raise VmError(f"{self.spec.name} init failed\n{self.diagnostic()}")
            if not self.alive():
                raise VmError(f"{self.spec.name}: qemu exited\n{self.diagnostic()}")
            if READY_MARKER in text:
                try:
                    self._call({"op": "ping"}, max(1.0, end - time.monotonic()))
                    return time.monotonic() - self.started_at
                except OSError:
                    pass
            if time.monotonic() > end:
                raise VmTimeout(f"{self.spec.name} not ready after {deadline_s} s\n"
                                f"{self.diagnostic()}")
            time.sleep(0.2)

    def _boot_again(self) -> None:
        self.kill()
        self.start()  # keeps the hung boot's log
        print(f"vmlab: {self.spec.name}: init printed nothing {SILENT_BOOT_S:.0f} s after "
              f"start (the kernel's boot hung): killed and booted once more; the first boot's "
              f"serial log: {self.kept_serial_log(self.boots - 1)}", file=sys.stderr, flush=True)

    def _call(self, request: dict, timeout: float) -> dict:
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as conn:
            conn.settimeout(timeout)
            conn.sendall(json.dumps(request).encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = conn.recv(1 << 16)
                if not chunk:
                    break
                data += chunk
        if not data:
            raise ConnectionError(f"{self.spec.name}: agent closed the connection")
        reply = json.loads(data)
        if not reply.get("ok"):
            raise VmError(f"{self.spec.name}: agent: {reply.get('error')}")
        return reply

    def run(self, cmd: str, timeout: float = 60.0) -> Result:
        """Runs a shell command in the guest; the guest kills it at the timeout."""
        try:
            r = self._call({"op": "run", "cmd": cmd, "timeout": timeout}, timeout + 15.0)
        except socket.timeout as exc:
            raise VmTimeout(f"{self.spec.name}: no reply to {cmd!r}\n{self.diagnostic()}") \
                from exc
        return Result(r["rc"], r["out"], r["err"], r["timed_out"], r["elapsed_s"])

    def ssh(self, cmd: str, timeout: float = 60.0) -> Result:
        """Runs a command through the guest's sshd, as on a real machine."""
        if self.spec.ssh_keys is None:
            raise VmError(f"{self.spec.name} was booted without sshd")
        argv = ssh_mod.client_argv(self.spec.ssh_keys, self.ssh_port) + [cmd]
        start = time.monotonic()
        try:
            r = subprocess.run(argv, capture_output=True, timeout=timeout,
                               stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            return Result(-1, (exc.stdout or b"").decode(errors="replace"),
                          (exc.stderr or b"").decode(errors="replace"), True, timeout)
        return Result(r.returncode, r.stdout.decode(errors="replace"),
                      r.stderr.decode(errors="replace"), False,
                      round(time.monotonic() - start, 3))


def _prune_runs(runs: pathlib.Path, keep: int) -> None:
    old = sorted(runs.glob("*-*"), key=lambda p: p.stat().st_mtime) if runs.exists() else []
    for d in old[:max(0, len(old) - keep + 1)]:
        shutil.rmtree(d, ignore_errors=True)


class VmGroup:
    """N VMs on one switch, in a fresh work directory under the clone's run state."""

    def __init__(self, n: int, rdma: str = "rxe", memory_mb: int = 512,
                 workdir: pathlib.Path | None = None, pcap: bool = True,
                 sshd: bool = True, seed: int = 1,
                 hide: list[pathlib.Path] | None = None,
                 sysctl: dict[str, str] | None = None, kernel: str | None = None,
                 cpus: int = 1, keep: list[pathlib.Path] | None = None) -> None:
        # sysctl None: RDMALAB_VM_SYSCTL's ("NAME=VALUE ..."), so that `make test-vm` sets the
        # guests of every lab its scenarios boot; unset, the kernel's defaults.
        if sysctl is None:
            sysctl = parse_sysctl(os.environ.get("RDMALAB_VM_SYSCTL", ""))
        # kernel: --kernel's value (a Debian suite or release); None: RDMALAB_VM_KERNEL's, else
        # bookworm. siw.ko is built only for a lab that uses it.
        self.kernel = prepare.ensure(kernel, siw=rdma == "siw")
        self.initrd = initrd_mod.ensure(self.kernel)
        self.moddir = moddep.ensure(self.kernel)
        keys = ssh_mod.ensure_keys() if sshd else None
        if workdir is None:
            _prune_runs(kernel_mod.STATE / "run", KEEP_RUNS)
            stamp = time.strftime("%Y%m%d-%H%M%S")
            workdir = kernel_mod.STATE / "run" / f"{stamp}-{os.getpid()}-{next(_run_seq)}"
        self.workdir = workdir
        shutil.rmtree(self.workdir, ignore_errors=True)
        self.workdir.mkdir(parents=True)
        self.switch_sock = self.workdir / "sw.sock"
        self.vms = [Vm(VmSpec(i + 1, rdma, memory_mb, cpus, ssh_keys=keys, hide=list(hide or []),
                           sysctl=dict(sysctl), keep=list(keep or [])),
                       self.workdir, self.switch_sock, self.kernel.vmlinuz, self.initrd,
                       release=self.kernel.release, moddir=self.moddir)
                    for i in range(n)]
        self.switch: subprocess.Popen | None = None
        self.switch_control: pathlib.Path | None = None  # the fault switch's control socket
        self.seed = seed
        self.pcap = self.workdir / "fabric.pcap" if pcap else None
        self.ssh_config = self.workdir / "ssh_config"
        if keys is not None:
            self.ssh_config.write_text("".join(
                ssh_mod.config_entry(keys, vm.spec.name, vm.ssh_port) for vm in self.vms))
        atexit.register(self.close)

    def start_switch(self) -> None:
        """The project's fault switch (faults/, rdmalab-switch) when it is built, with its
        control socket; else the Python learning switch (no rules), e.g. for `make vmlab`."""
        binary = switch_binary()
        if binary.exists():
            self.switch_control = self.workdir / "sw.ctl"
            argv = [str(binary), "--sock", str(self.switch_sock), "--control",
                    str(self.switch_control), "--seed", str(self.seed)]
        else:
            self.switch_control = None
            argv = [sys.executable, "-m", "rdmalab.machines.vmlab.switch", "--sock", str(self.switch_sock)]
        for vm in self.vms:
            argv += ["--peer", str(vm.sock)]
        if self.pcap is not None:
            argv += ["--pcap", str(self.pcap)]
        with open(self.workdir / "switch.log", "ab") as log:
            self.switch = subprocess.Popen(argv, cwd=kernel_mod.REPO, stdout=log,
                                           stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           preexec_fn=_die_with_parent)
        end = time.monotonic() + 10.0
        while not self.switch_sock.exists():
            if self.switch.poll() is not None or time.monotonic() > end:
                raise VmError(f"switch did not start:\n{tail(self.workdir / 'switch.log')}")
            time.sleep(0.05)

    def start_all(self) -> None:
        if self.switch is None:
            self.start_switch()
        for vm in self.vms:
            vm.start()

    def wait_all_ready(self, deadline_s: float = BOOT_DEADLINE_S) -> list[float]:
        return [vm.wait_ready(deadline_s) for vm in self.vms]

    def close(self) -> None:
        """Powers off what answers, kills the rest and the switch. Safe to call twice."""
        threads = [threading.Thread(target=vm.poweroff, args=(20.0,)) for vm in self.vms]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60.0)  # poweroff's own waits end well before this
        for vm in self.vms:
            vm.kill()
        if self.switch is not None and self.switch.poll() is None:
            self.switch.terminate()
            try:
                self.switch.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.switch.kill()
                self.switch.wait(timeout=5)

    def __enter__(self) -> "VmGroup":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@atexit.register
def _kill_leftovers() -> None:
    for vm in list(_live):
        vm.kill()
