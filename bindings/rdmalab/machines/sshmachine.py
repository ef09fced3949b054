"""A machine from an inventory, reached with OpenSSH's own `ssh` (rdmalab.machines.machine's protocol).

Every ssh this module starts reads one generated ssh_config (private directory, mode 0600),
so run(), copy_to(), ssh_argv() and execnet's gateway use exactly the same options: host key
checked against the inventory's known_hosts and never accepted blindly, no password prompts,
a dead host noticed within ~15 s (ServerAlive), and nothing from ~/.ssh/config.

Commands share one connection per host (a master, ssh -M, kept as this process's child): a new
SSH connection costs its key exchange on the host, 3-4 s of CPU on a TCG guest against 0.3 s for
a session over the master, and under load a slow exchange failed a run ("Connection timed out
during banner exchange"). Clients use ControlMaster=no: when the master is gone (host lost,
rebooted) they connect on their own, and the next command starts a new master.
"""
from __future__ import annotations

import math
import os
import pathlib
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
import weakref
from typing import Iterable, Optional

from .inventory import DEFAULT_AGENT_DIR, HostEntry, Inventory
from .machine import (HostFacts, MachineError, MachineUnreachable, OwnKernelMachine,
                      PowerNotSupported, Result, wait_for_ssh)

CONNECT_TIMEOUT_S = 10
CONTROL = "cm"         # the master's socket, beside the ssh_config
MASTER_RETRY_S = 5.0   # a master that died is not started again sooner (a host that is down)
POWER_TIMEOUT_S = 120.0

# ssh's own words for "could not reach the host" (exit status 255); anything else with 255 is
# the remote command's status.
_UNREACHABLE = ("Connection refused", "Connection timed out", "timed out", "No route to host",
                "Network is unreachable", "Could not resolve hostname",
                "Name or service not known", "Temporary failure in name resolution",
                "Connection closed by", "Connection reset", "kex_exchange_identification",
                "Broken pipe", "not responding", "banner exchange", "Connection to ")
_KEY_CHANGED = "REMOTE HOST IDENTIFICATION HAS CHANGED"
_KEY_FAILED = ("Host key verification failed", "host key is known for",
               "No matching host key", _KEY_CHANGED)


class HostKeyError(MachineError):
    """The host's SSH key is unknown to, or differs from, the inventory's known_hosts."""


def _cfg_value(v: str) -> str:
    # ssh_config expands %-tokens in paths and splits on spaces: escape and quote.
    return '"' + str(v).replace("%", "%%").replace('"', "") + '"'


class SshMachine(OwnKernelMachine):
    """One inventory host over SSH. Not thread-safe for the first call (the config is written
    lazily); commands themselves may run from several threads."""

    def __init__(self, entry: HostEntry, known_hosts: str | os.PathLike,
                 agent_dir: str = DEFAULT_AGENT_DIR):
        self.entry = entry
        self.name: str = entry.name
        self.facts: HostFacts = entry.facts
        self.known_hosts = pathlib.Path(known_hosts)
        self.agent_dir = agent_dir
        self._dir: Optional[pathlib.Path] = None
        # The master connection, in a box the finalizer shares (it must not hold self).
        self._box: list[Optional[subprocess.Popen]] = [None]
        self._master_started = -MASTER_RETRY_S
        self._master_lock = threading.Lock()

    def __repr__(self) -> str:
        s = self.entry.ssh
        return f"SshMachine({self.name} {s.user}@{s.address}:{s.port})"

    # -- ssh configuration ----------------------------------------------------------------

    @property
    def target(self) -> str:
        s = self.entry.ssh
        return f"{s.user}@{s.address}:{s.port}"

    @property
    def ssh_config(self) -> pathlib.Path:
        """The generated ssh_config (one `Host <name>` block), written on first use."""
        if self._dir is None:
            d = pathlib.Path(tempfile.mkdtemp(prefix=f"rdmalab-ssh-{self.name}-"))  # 0700
            cfg = d / "ssh_config"
            fd = os.open(cfg, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(self.config_text(d / CONTROL))
            self._dir = d
            weakref.finalize(self, _cleanup, self._box, str(d))
        return self._dir / "ssh_config"

    def config_text(self, control_path: Optional[pathlib.Path] = None) -> str:
        """control_path: the master connection's socket (none: every ssh connects itself)."""
        s = self.entry.ssh
        opts = [("HostName", s.address), ("Port", str(s.port)), ("User", s.user),
                ("BatchMode", "yes"),                       # never a password prompt
                ("StrictHostKeyChecking", "yes"),           # unknown or changed key: refuse
                ("UserKnownHostsFile", _cfg_value(self.known_hosts)),
                ("UpdateHostKeys", "no"),                   # the file is the user's to edit
                ("CheckHostIP", "no"),
                ("ConnectTimeout", str(CONNECT_TIMEOUT_S)),
                ("ServerAliveInterval", "5"), ("ServerAliveCountMax", "3"),
                ("LogLevel", "ERROR"),
                ("ControlMaster", "no"),
                ("ControlPath", _cfg_value(control_path) if control_path else "none"),
                ("ForwardAgent", "no"), ("ForwardX11", "no"),
                ("RequestTTY", "no")]
        if s.identity:
            opts += [("IdentityFile", _cfg_value(s.identity)), ("IdentitiesOnly", "yes")]
        if s.host_key_alias:
            opts.append(("HostKeyAlias", s.host_key_alias))
        return f"Host {self.name}\n" + "".join(f"  {k} {v}\n" for k, v in opts)

    def ssh_argv(self) -> list[str]:
        self._ensure_master()
        return ["ssh", "-F", str(self.ssh_config), self.name]

    @property
    def _master(self) -> Optional[subprocess.Popen]:
        return self._box[0]

    @_master.setter
    def _master(self, p: Optional[subprocess.Popen]) -> None:
        self._box[0] = p

    def _ensure_master(self) -> None:
        """Starts the master connection when there is none (at most once per MASTER_RETRY_S).
        Commands issued before it has logged in connect on their own."""
        cfg = self.ssh_config
        with self._master_lock:
            if self._master is not None:
                if self._master.poll() is None:
                    return
                # A killed master leaves its socket: clients would warn about it on stderr
                # and a new master could not bind it.
                self._master = None
                (cfg.parent / CONTROL).unlink(missing_ok=True)
            if time.monotonic() - self._master_started < MASTER_RETRY_S:
                return
            self._master_started = time.monotonic()
            # stdio to /dev/null: the master must not hold a command's pipes open.
            self._master = self._popen(
                ["ssh", "-F", str(cfg), "-M", "-N", "-q", "-o", "ControlPersist=no",
                 self.name], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, start_new_session=True)

    def drop_master(self) -> None:
        """Ends the master connection now (before a power cycle: its sessions would wait for
        ServerAlive to notice the old host is gone)."""
        with self._master_lock:
            m, self._master = self._master, None
            self._master_started = -MASTER_RETRY_S
            _stop(m)
            if self._dir is not None:
                (self._dir / CONTROL).unlink(missing_ok=True)

    def execnet_spec(self, python: str = "/usr/bin/python3") -> str:
        # The agent's long session: -q keeps "closed by remote host" (printed straight to
        # stderr when the host dies) off the run's terminal, -E logs the rest.
        log = pathlib.Path(self.ssh_config).with_name("ssh.log")
        return f"ssh=-q -E {log} {self.name}//ssh_config={self.ssh_config}//python={python}"

    # -- commands -------------------------------------------------------------------------

    def _remote(self, cmd: str, root: bool) -> str:
        if root and self.entry.ssh.user != "root":
            return "sudo -n sh -c " + shlex.quote(cmd)   # -n: fail, never prompt
        return cmd

    def _popen(self, argv: list[str], **kw) -> subprocess.Popen:
        try:
            return subprocess.Popen(argv, **kw)
        except FileNotFoundError:
            raise MachineError(f"{self.name}: {argv[0]} not found on the controller "
                               f"(apt-get install openssh-client)") from None

    def _ssh_failure(self, rc: int, err: str) -> Optional[MachineError]:
        """The exception for an ssh-level failure, None when rc/err are the command's own."""
        text = err.strip()
        where = f"{self.name} ({self.target}, ssh_config {self.ssh_config})"
        if any(k in err for k in _KEY_FAILED):
            s = self.entry.ssh
            known_as = s.host_key_alias or (s.address if s.port == 22
                                            else f"[{s.address}]:{s.port}")
            if _KEY_CHANGED in err:
                what = (f"the SSH host key of {where} has CHANGED from the one recorded for "
                        f"{known_as} in {self.known_hosts}; refusing to connect. If the host "
                        f"was reinstalled, verify its new key, then "
                        f"`ssh-keygen -R '{known_as}' -f {self.known_hosts}` and add it")
            else:
                what = (f"the SSH host key of {where} is not in {self.known_hosts} (looked up "
                        f"as {known_as}); refusing to connect. Verify the key's fingerprint "
                        f"on the host and add it to that file")
            said = "\n".join(l for l in text.splitlines() if not l.startswith("@"))
            return HostKeyError(f"{what}\nssh said: {said}")
        if rc != 255:
            return None
        if "Permission denied" in err:
            ident = self.entry.ssh.identity or "an SSH agent's keys"
            return MachineError(f"{where}: login refused for user {self.entry.ssh.user} "
                                f"with {ident}: {text}")
        if any(k in err for k in _UNREACHABLE) or text.startswith("ssh:"):
            return MachineUnreachable(f"{where}: unreachable: tried ssh to "
                                      f"{self.entry.ssh.address} port {self.entry.ssh.port} "
                                      f"as {self.entry.ssh.user}: {text}")
        return None

    def run(self, cmd: str, timeout: float = 60.0, *, root: bool = False) -> Result:
        start = time.monotonic()
        # Killing ssh does not kill the remote command (no tty, no SIGHUP): coreutils'
        # timeout on the host ends it, and its process group, just after ours fires. The
        # login shell runs the command, as it would without the wrapper.
        remote = (f'timeout -k 5 {math.ceil(timeout) + 1} "${{SHELL:-/bin/sh}}" -c '
                  f"{shlex.quote(self._remote(cmd, root))}")
        p = self._popen(self.ssh_argv() + [remote], stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        timed_out = False
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            p.kill()
            out, err = p.communicate()
        res = Result(p.returncode, out.decode(errors="replace"), err.decode(errors="replace"),
                     timed_out, time.monotonic() - start)
        if not timed_out:
            e = self._ssh_failure(res.rc, res.err)
            if e is not None:
                raise e
        return res

    def popen(self, cmd: str, *, root: bool = False, stdin: bool = False) -> subprocess.Popen:
        """stdout and stderr together as bytes; stdin=True gives a pipe (closing it ends a
        command that reads it, also when this process dies)."""
        return self._popen(self.ssh_argv() + [self._remote(cmd, root)],
                           stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def _pipe(self, producer: Optional[list[str]], stdin_file, remote: str, timeout: float,
              what: str, stdout=subprocess.DEVNULL) -> None:
        """Runs `producer | ssh remote` (or ssh with stdin_file) and raises on failure."""
        prod = None
        if producer is not None:
            prod = subprocess.Popen(producer, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            stdin_file = prod.stdout
        try:
            p = self._popen(self.ssh_argv() + [remote], stdin=stdin_file, stdout=stdout,
                            stderr=subprocess.PIPE)
        except MachineError:
            if prod is not None:
                prod.kill()
                prod.wait()
            raise
        if prod is not None:
            prod.stdout.close()            # ssh owns the read end now: EPIPE reaches tar
        try:
            _, err = p.communicate(timeout=timeout)
            perr = prod.communicate(timeout=10)[1] if prod else b""
        except subprocess.TimeoutExpired:
            for q in (p, prod):
                if q is not None:
                    q.kill()
                    q.wait()
            raise MachineError(f"{self.name}: {what}: timed out after {timeout} s") from None
        e_text = err.decode(errors="replace")
        e = self._ssh_failure(p.returncode, e_text)
        if e is not None:
            raise e
        if p.returncode != 0 or (prod is not None and prod.returncode != 0):
            raise MachineError(f"{self.name}: {what}: rc {p.returncode}: {e_text.strip()}"
                               + (f" (local: {perr.decode(errors='replace').strip()})"
                                  if perr else ""))

    def copy_to(self, local: str, remote: str, timeout: float = 300.0) -> None:
        """A directory's contents into the remote directory `remote` (created), or a file to
        the remote path `remote` (its mode kept)."""
        src = pathlib.Path(local)
        q = shlex.quote(remote)
        what = f"copy {local} to {self.name}:{remote}"
        if src.is_dir():
            # --no-same-owner: the controller's uids mean nothing on the host.
            self._pipe(["tar", "-C", str(src), "-cf", "-", "."], None,
                       f"mkdir -p {q} && tar --no-same-owner -C {q} -xf -", timeout, what)
        elif src.is_file():
            mode = f"{src.stat().st_mode & 0o7777:o}"
            parent = shlex.quote(os.path.dirname(remote) or ".")
            with open(src, "rb") as f:
                self._pipe(None, f, f"mkdir -p {parent} && cat > {q} && chmod {mode} {q}",
                           timeout, what)
        else:
            raise MachineError(f"{self.name}: {what}: {local} does not exist")

    def copy_from(self, remote: str, local: str, timeout: float = 300.0) -> None:
        dst = pathlib.Path(local)
        dst.parent.mkdir(parents=True, exist_ok=True)
        part = dst.with_name(dst.name + ".part")   # no half-written file under the real name
        try:
            with open(part, "wb") as f:
                self._pipe(None, subprocess.DEVNULL, f"cat {shlex.quote(remote)}", timeout,
                           f"copy {self.name}:{remote} to {local}", stdout=f)
            part.replace(dst)
        finally:
            part.unlink(missing_ok=True)

    # -- power: command lines from the inventory, run here on the controller --------------

    @property
    def can_power(self) -> bool:
        """True when power_cycle works: a cycle command, or both off and on."""
        p = self.entry.power
        return bool(p.cycle or (p.off and p.on))

    def _power(self, which: str) -> None:
        cmd = getattr(self.entry.power, which)
        if not cmd:
            raise PowerNotSupported(f"{self.name}: no power.{which} command in the inventory")
        env = dict(os.environ, RDMALAB_HOST=self.name, RDMALAB_ADDRESS=self.entry.ssh.address)
        try:
            p = subprocess.run(cmd, shell=True, stdin=subprocess.DEVNULL, capture_output=True,
                               text=True, timeout=POWER_TIMEOUT_S, env=env)
        except subprocess.TimeoutExpired:
            raise MachineError(f"{self.name}: power {which} command timed out after "
                               f"{POWER_TIMEOUT_S:.0f} s: {cmd}") from None
        if p.returncode != 0:
            raise MachineError(f"{self.name}: power {which} command failed (rc {p.returncode})"
                               f": {cmd}\nstdout:\n{p.stdout[-2000:]}\n"
                               f"stderr:\n{p.stderr[-2000:]}")

    def power_off(self) -> None:
        self.drop_master()
        self._power("off")

    def power_on(self) -> None:
        self._power("on")

    def power_cycle(self) -> None:
        self.drop_master()
        p = self.entry.power
        if p.cycle:
            self._power("cycle")
        elif p.off and p.on:
            self._power("off")
            self._power("on")
        else:
            raise PowerNotSupported(f"{self.name}: no power.cycle command in the inventory "
                                    f"(nor both power.off and power.on)")

    # -- readiness ------------------------------------------------------------------------

    def wait_ready(self, deadline_s: float = 180.0) -> float:
        start = time.monotonic()
        try:
            if self.run("true", timeout=min(15.0, deadline_s)).rc == 0:
                return time.monotonic() - start
        except MachineUnreachable:
            pass                            # booting: poll below
        # A host key or login refusal will not heal by waiting: it propagates above.
        return (time.monotonic() - start) + wait_for_ssh(
            self, max(0.0, deadline_s - (time.monotonic() - start)))

    def alive(self) -> bool:
        try:
            return self.run("true", timeout=CONNECT_TIMEOUT_S + 2).rc == 0
        except MachineError:
            return False


def _stop(master: Optional[subprocess.Popen]) -> None:
    if master is not None and master.poll() is None:
        master.terminate()
        try:
            master.wait(timeout=5)
        except subprocess.TimeoutExpired:
            master.kill()
            master.wait()


def _cleanup(box: list[Optional[subprocess.Popen]], d: str) -> None:
    _stop(box[0])
    shutil.rmtree(d, True)


def inventory_machines(inv: Inventory) -> list[SshMachine]:
    """One SshMachine per host of the inventory, in file order."""
    return [SshMachine(h, inv.known_hosts, inv.agent_dir) for h in inv.hosts]


def unreachable(machines: Iterable[SshMachine], deadline_s: float = 30.0
                ) -> list[tuple[SshMachine, str]]:
    """Each machine reached once over ssh (`true`), all at once, the whole within deadline_s:
    the ones that could not be, in their order, each with why (ssh's own words: no route,
    refused, host key unknown or changed, login refused; or no answer in time)."""
    machines = list(machines)
    why: dict[int, Optional[str]] = {}
    per_host = max(1.0, deadline_s)  # ssh's ConnectTimeout bounds the connection itself

    def probe(i: int, m: SshMachine) -> None:
        try:
            r = m.run("true", timeout=per_host)
        except MachineError as e:
            why[i] = str(e)
            return
        except Exception as e:  # noqa: BLE001 - whatever it is, the host was not reached
            why[i] = f"{type(e).__name__}: {e}"
            return
        if r.timed_out:
            why[i] = f"{m.target}: no answer within {per_host:g} s (ssh `true`)"
        elif r.rc != 0:
            why[i] = (f"{m.target}: `true` over ssh exited with status {r.rc}: "
                      f"{r.err.strip()[-300:]}")
        else:
            why[i] = None

    threads = [threading.Thread(target=probe, args=(i, m), daemon=True,
                                name=f"rdmalab-probe-{m.name}")
               for i, m in enumerate(machines)]
    for t in threads:
        t.start()
    end = time.monotonic() + deadline_s
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))
    out = []
    for i, (m, t) in enumerate(zip(machines, threads)):
        if t.is_alive() or i not in why:
            out.append((m, f"{m.target}: no answer within {deadline_s:g} s"))
        elif why[i]:
            out.append((m, why[i]))
    return out
