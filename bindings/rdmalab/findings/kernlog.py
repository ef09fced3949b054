"""Kernel logs as an oracle: a host's /dev/kmsg since a scenario started, and the splats in it
(WARNING, BUG, Oops, KASAN, UBSAN, RCU stalls, hung tasks).

Host side (runs in the agent, rdmalab.agent.serve, shipped with the package): kmsg_mark() notes where
the log is now (the boot and the last sequence number); kmsg_since(mark) reads every record
after it. /dev/kmsg gives each record its sequence number, so nothing is read twice or missed
between the two calls (records overwritten meanwhile are counted as lost).

Controller side (pure): find_splats(lines) picks the splats out of the records: a start line
(SPLAT_STARTS) and the lines after it up to the "---[ end trace" marker, the next start line, or
MAX_SPLAT_LINES. from_dmesg(text) reads `dmesg` text for tests and by hand.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import time
from typing import Iterable, Optional

KMSG = "/dev/kmsg"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
MAX_SPLAT_LINES = 80   # a splat without an end marker (hung task, RCU stall) ends here
MAX_RECORDS = 20000    # records one kmsg_since returns at most (a log storm is capped)
LEVELS = ("emerg", "alert", "crit", "err", "warning", "notice", "info", "debug")

# Where a splat starts: the kernel's own report headers, at the start of the message (a driver
# that prints "WARNING" inside its own message is not a splat).
SPLAT_STARTS = (
    ("warning", re.compile(r"^WARNING: ")),                       # WARN*(), lockdep
    ("bug", re.compile(r"^(?:watchdog: )?BUG: ")),               # BUG: KASAN / NULL / soft lockup
    ("bug", re.compile(r"^kernel BUG at ")),                      # BUG_ON()
    ("oops", re.compile(r"^(?:Internal error: )?Oops(?: -|:)")),  # "Oops: 0002 [#1]", arm's
    ("oops", re.compile(r"^general protection fault")),
    ("ubsan", re.compile(r"^UBSAN: ")),
    ("rcu_stall", re.compile(r"^(?:rcu: )?INFO: \S+ (?:self-)?detected stalls?")),
    ("rcu_stall", re.compile(r"\brcu_sched detected stalls")),
    ("hung_task", re.compile(r"^INFO: task \S.* blocked for more than \d+ seconds")),
    ("panic", re.compile(r"^Kernel panic - not syncing")),
)
END_MARK = re.compile(r"^---\[ end (?:trace|Kernel panic)")
_DMESG = re.compile(r"^\s*(?:<(\d+)>)?\s*\[\s*(\d+)\.(\d+)\]\s?(.*)$")


@dataclasses.dataclass(frozen=True)
class Line:
    """One kernel log record: its kmsg sequence number, time (µs since boot, the kernel's
    clock), level (0 emerg .. 7 debug) and text."""
    seq: int
    ts_us: int
    level: int
    text: str

    @property
    def level_name(self) -> str:
        return LEVELS[self.level] if 0 <= self.level < len(LEVELS) else str(self.level)

    def dmesg(self) -> str:
        return f"[{self.ts_us // 10**6:5d}.{self.ts_us % 10**6:06d}] {self.text}"


@dataclasses.dataclass
class Splat:
    kind: str            # warning, bug, oops, ubsan, rcu_stall, hung_task, panic
    lines: list          # [Line]: the start line first
    ended: bool = False  # closed by the end-trace marker (else cut at the next start or bound)

    @property
    def first_line(self) -> str:
        return self.lines[0].text

    @property
    def text(self) -> str:
        return "\n".join(l.text for l in self.lines)

    def dmesg(self) -> str:
        return "\n".join(l.dmesg() for l in self.lines) + "\n"


def splat_kind(text: str) -> Optional[str]:
    """The kind of splat a log line starts, or None."""
    for kind, pattern in SPLAT_STARTS:
        if pattern.search(text):
            return kind
    return None


def find_splats(lines: Iterable[Line], max_lines: int = MAX_SPLAT_LINES) -> list[Splat]:
    """The splats among the lines, in order. A splat takes the lines after its start line up
    to and including an end-trace marker, stopping before the next start line, after
    max_lines lines in all."""
    out: list[Splat] = []
    cur: Optional[Splat] = None
    for line in lines:
        kind = splat_kind(line.text)
        if kind is not None:
            cur = Splat(kind, [line])
            out.append(cur)
            continue
        if cur is None:
            continue
        cur.lines.append(line)
        if END_MARK.search(line.text):
            cur.ended = True
            cur = None
        elif len(cur.lines) >= max_lines:
            cur = None
    return out


def from_dmesg(text: str) -> list[Line]:
    """Lines of `dmesg` / `dmesg -r` output ("[   12.345678] text", "<4>[ 12.3] text"); a
    line without a time stamp continues the one before (its seq repeats)."""
    out: list[Line] = []
    for raw in text.splitlines():
        m = _DMESG.match(raw)
        if m:
            level = int(m.group(1)) & 7 if m.group(1) else 6
            frac = (m.group(3) + "000000")[:6]
            out.append(Line(len(out) + 1, int(m.group(2)) * 10**6 + int(frac), level,
                            m.group(4)))
        elif raw.strip() and out:
            prev = out[-1]
            out.append(Line(prev.seq, prev.ts_us, prev.level, raw))
    return out


def parse_record(record: str) -> Optional[Line]:
    """One /dev/kmsg record, "PRI,SEQ,TS_USEC,FLAGS[,...];TEXT" (+ " KEY=VALUE" dictionary
    lines, dropped); None for one it cannot read. Non-printable bytes stay escaped (\\xNN)."""
    head, sep, rest = record.partition(";")
    fields = head.split(",")
    if not sep or len(fields) < 3:
        return None
    try:
        prio, seq, ts = int(fields[0]), int(fields[1]), int(fields[2])
    except ValueError:
        return None
    return Line(seq, ts, prio & 7, rest.split("\n", 1)[0])


# -- host side: runs in the agent ----------------------------------------------------------------

def _boot_id() -> str:
    try:
        with open(BOOT_ID) as f:
            return f.read().strip()
    except OSError:
        return ""


def _records(since: int, deadline_s: float, max_records: int
             ) -> tuple[list, int, bool, str, int]:
    """kmsg records with seq > since: ([(seq, ts_us, level, text)], lost, truncated, error,
    the last seq seen or -1)."""
    out: list = []
    lost, truncated, last = 0, False, -1
    end = time.monotonic() + deadline_s
    try:
        fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        return out, 0, False, f"{KMSG}: {e.strerror}", last
    try:
        while time.monotonic() < end:
            try:
                data = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno == errno.EPIPE:  # overwritten before we read it
                    lost += 1
                    continue
                if e.errno == errno.EINVAL:  # a record longer than the buffer: skip it
                    continue
                return out, lost, truncated, f"{KMSG}: {e.strerror}", last
            line = parse_record(data.decode("utf-8", "replace"))
            if line is None or line.seq <= since:
                continue
            if last >= 0 and line.seq > last + 1:
                lost += line.seq - last - 1
            last = line.seq
            if len(out) >= max_records:
                truncated = True
                continue
            out.append((line.seq, line.ts_us, line.level, line.text))
        else:
            truncated = True  # the deadline came first: what was read so far
    finally:
        os.close(fd)
    return out, lost, truncated, "", last


def kmsg_mark(deadline_s: float = 5.0) -> dict:
    """Where the kernel log is now: {"boot_id", "seq" (the last record's), "error"}."""
    _, _, _, err, last = _records(-1, deadline_s, 0)
    return {"boot_id": _boot_id(), "seq": last, "error": err}


def kmsg_since(mark: Optional[dict], deadline_s: float = 5.0,
               max_records: int = MAX_RECORDS) -> dict:
    """Every record after mark (all of this boot's when the host rebooted since, or when there
    is no mark): {"records": [[seq, ts_us, level, text], ...], "lost", "truncated",
    "rebooted", "boot_id", "error"}."""
    boot = _boot_id()
    rebooted = bool(mark and mark.get("boot_id") and mark["boot_id"] != boot)
    since = -1 if rebooted or not mark else int(mark.get("seq", -1))
    records, lost, truncated, err, _ = _records(since, deadline_s, max_records)
    return {"records": records, "lost": lost, "truncated": truncated, "rebooted": rebooted,
            "boot_id": boot, "error": err}


def clock_pair() -> tuple[int, int]:
    """(CLOCK_REALTIME, CLOCK_MONOTONIC) in ns, read together: converts a pcap's wall-clock
    time stamps onto this host's monotonic clock."""
    return time.time_ns(), time.monotonic_ns()
