"""Facts about the kernel this process runs on that the stack's timing depends on.

kernel_hz(): CONFIG_HZ, from the kernel's own config (/proc/config.gz, /boot/config-<release>),
else measured from /proc/timer_list (jiffies against the monotonic clock; root only), else 0
(unknown: rdmalab.api.cm_timing then spans every HZ Linux offers)."""

from __future__ import annotations

import dataclasses
import functools
import gzip
import os
import re
import time
from typing import Optional

HZ_CHOICES = (100, 250, 300, 1000)  # kernel/Kconfig.hz
# The kernel every model personality stands for: the VM lab's (Debian 6.1.0-56, 6.1.192).
MODEL_KERNEL_RELEASE = "6.1.192"
_CONFIG_HZ = re.compile(rb"^CONFIG_HZ=(\d+)$", re.M)
_JIFFIES = re.compile(rb"^jiffies: (\d+)$", re.M)
_NOW = re.compile(rb"^now at (\d+) nsecs$", re.M)


def hz_from_config(text: bytes) -> Optional[int]:
    m = _CONFIG_HZ.search(text)
    return int(m.group(1)) if m else None


def _read(path: str) -> Optional[bytes]:
    try:
        with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def hz_from_timer_list(first: bytes, second: bytes) -> Optional[int]:
    """HZ from two reads of /proc/timer_list: jiffies advanced over nsecs, snapped to the
    nearest Kconfig choice."""
    try:
        j0, j1 = (int(_JIFFIES.search(t).group(1)) for t in (first, second))
        n0, n1 = (int(_NOW.search(t).group(1)) for t in (first, second))
    except AttributeError:
        return None
    if n1 <= n0 or j1 <= j0:
        return None
    rate = (j1 - j0) * 1e9 / (n1 - n0)
    return min(HZ_CHOICES, key=lambda hz: abs(hz - rate))


@dataclasses.dataclass(frozen=True)
class KernelIdentity:
    """The kernel a device runs under, as far as its caps tell: its timer tick (CONFIG_HZ, 0 =
    unknown), its release (findings.toml kernels.fixed compares it), its TCP SYN retries."""
    hz: int
    release: str
    tcp_syn_retries: int


def this_kernel() -> KernelIdentity:
    """The kernel this process runs on."""
    return KernelIdentity(kernel_hz(), kernel_release(), tcp_syn_retries())


def release_version(release: str) -> Optional[tuple[int, int]]:
    """(major, minor) of a kernel release string ("6.1.0-56-amd64" -> (6, 1)), else None."""
    m = re.match(r"^(\d+)\.(\d+)", release or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def kernel_release() -> str:
    return os.uname().release


@functools.lru_cache(maxsize=None)
def kernel_hz() -> int:
    release = os.uname().release
    for path in ("/proc/config.gz", f"/boot/config-{release}",
                 f"/lib/modules/{release}/build/.config"):
        text = _read(path)
        hz = hz_from_config(text) if text else None
        if hz:
            return hz
    first = _read("/proc/timer_list")
    if first:
        time.sleep(0.2)
        second = _read("/proc/timer_list")
        hz = hz_from_timer_list(first, second) if second else None
        if hz:
            return hz
    return 0


TCP_SYN_RETRIES_DEFAULT = 6  # include/net/tcp.h TCP_SYN_RETRIES


@functools.lru_cache(maxsize=None)
def tcp_syn_retries() -> int:
    """net.ipv4.tcp_syn_retries of this host (/proc/sys/net/ipv4/tcp_syn_retries); the
    kernel's default where it cannot be read."""
    text = _read("/proc/sys/net/ipv4/tcp_syn_retries")
    try:
        return int(text.strip()) if text else TCP_SYN_RETRIES_DEFAULT
    except ValueError:
        return TCP_SYN_RETRIES_DEFAULT
