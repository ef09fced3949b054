"""SSH into the guests over the control NIC: the path a real machine would take (DESIGN.md:
agents driven through execnet over SSH).

The keys are made once per clone on the host under its .cache/vmlab/ssh (kernel.STATE: run
state, not the shared artifact cache) and read by the guest's sshd through the read-only 9p
root, so the guest spends no boot time on key generation and the controller pins the host key
(HostKeyAlias=vmlab; every VM presents the same key). They open nothing but VMs reachable on
127.0.0.1 through qemu's hostfwd.
"""
from __future__ import annotations

import pathlib
import subprocess

from . import kernel as kernel_mod

ALIAS = "vmlab"


def key_dir() -> pathlib.Path:
    return kernel_mod.STATE / "ssh"


def ensure_keys() -> pathlib.Path:
    """Client key, host key, authorized_keys and known_hosts; made once, then reused."""
    d = key_dir()
    client, host = d / "id_ed25519", d / "ssh_host_ed25519_key"
    if (d / "known_hosts").exists():
        return d
    d.mkdir(parents=True, exist_ok=True)
    d.chmod(0o700)
    for key in (client, host):
        if not key.exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", ALIAS,
                            "-f", str(key)], check=True, timeout=60)
    (d / "authorized_keys").write_text((d / "id_ed25519.pub").read_text())
    pub = (d / "ssh_host_ed25519_key.pub").read_text().split()
    (d / "known_hosts").write_text(f"{ALIAS} {pub[0]} {pub[1]}\n")
    return d


def config_entry(d: pathlib.Path, name: str, port: int, connect_timeout_s: int = 10) -> str:
    """An ssh_config block, so that `ssh -F <file> vm1` and execnet's
    "ssh=vm1//ssh_config=<file>//python=/usr/bin/python3" reach the guest."""
    return (f"Host {name}\n  HostName 127.0.0.1\n  Port {port}\n  User root\n"
            f"  IdentityFile {d / 'id_ed25519'}\n  IdentitiesOnly yes\n  BatchMode yes\n"
            f"  HostKeyAlias {ALIAS}\n  UserKnownHostsFile {d / 'known_hosts'}\n"
            f"  StrictHostKeyChecking yes\n  ConnectTimeout {connect_timeout_s}\n"
            f"  LogLevel ERROR\n")


def client_argv(d: pathlib.Path, port: int, connect_timeout_s: int = 10) -> list[str]:
    """ssh to a guest whose port 22 is forwarded to 127.0.0.1:port; append the command."""
    return ["ssh", "-i", str(d / "id_ed25519"), "-p", str(port), "-F", "/dev/null",
            "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
            "-o", f"HostKeyAlias={ALIAS}", "-o", f"UserKnownHostsFile={d / 'known_hosts'}",
            "-o", "StrictHostKeyChecking=yes", "-o", f"ConnectTimeout={connect_timeout_s}",
            "-o", "LogLevel=ERROR", "root@127.0.0.1"]
