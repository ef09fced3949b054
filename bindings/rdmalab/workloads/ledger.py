"""The durability ledger (host side, in the initiator's agent): a writer that stamps blocks of
a block device with (block, generation) through O_DIRECT | O_DSYNC, so that a write that
returned is one the device said is durable (a FUA or a flush after it: the kernel's
documented O_DSYNC contract, open(2)), and a read-back that judges every block against what
was acknowledged.

A block may hold its last acknowledged generation or a later one whose write had not
returned (in flight at a fault: old or new data, never anything else); an older generation is
lost, anything else is corrupt. Jepsen's register model, one register per block."""

from __future__ import annotations

import errno as _errno
import itertools
import mmap
import os
import random
import struct
import threading
import time
from typing import Optional

from . import records
from .host import answered, host_name

BLOCK = 4096
MAGIC = b"RDMALAB\x01"
_HEAD = struct.Struct("<8sQIQ")  # magic, the ledger's run, block, generation
PROGRESS_S = 1.0  # an io record at least this often while writes go on
_LEDGERS: dict[int, "Ledger"] = {}
_IDS = itertools.count(1)


def _image(run: int, block: int, gen: int) -> bytes:
    """The block's content for a generation: its stamp, then a pattern only it writes."""
    head = _HEAD.pack(MAGIC, run, block, gen)
    fill = struct.pack("<Q", run ^ (block << 40) ^ gen) * ((BLOCK - len(head)) // 8 + 1)
    return (head + fill)[:BLOCK]


class Ledger:
    def __init__(self, lab, workload: str, device: str, blocks: int, seed: int):
        self.lab, self.workload, self.device, self.blocks = lab, workload, device, blocks
        self.host = host_name(lab)
        self.acked: dict[int, int] = {}       # block -> its last acknowledged generation
        self.pending: dict[int, set] = {}     # block -> generations written, not acknowledged
        self.ok = self.errors = 0
        self.first_error = ""
        self.in_write_since: Optional[int] = None  # monotonic ns a write started, if one runs
        self._rng = random.Random(seed)
        # A block another ledger wrote (an earlier scenario on the same disk) is one this
        # ledger never wrote: its stamp carries another run.
        self.run = random.SystemRandom().getrandbits(63)
        self._gen = itertools.count(1)
        self._stop = threading.Event()
        self._fd = os.open(device, os.O_RDWR | os.O_DIRECT | os.O_DSYNC)
        self._buf = mmap.mmap(-1, BLOCK)  # page-aligned, as O_DIRECT needs
        self._thread = threading.Thread(target=self._run, daemon=True, name="rdmalab-ledger")
        lab.add_closer(self.close)
        self._thread.start()

    def _io_record(self, phase: str, ok: int, errors: int, error: str = "") -> None:
        self.lab.record(records.IO, object=self.workload, host=self.host, op="write",
                        phase=phase, ok=ok, errors=errors, error=error, device=self.device)

    def _run(self) -> None:
        ok_since = err_since = 0
        failing, last = False, time.monotonic()
        while not self._stop.is_set():
            block, gen = self._rng.randrange(self.blocks), next(self._gen)
            self._buf[:] = _image(self.run, block, gen)
            self.pending.setdefault(block, set()).add(gen)
            self.in_write_since = time.monotonic_ns()
            try:
                os.pwrite(self._fd, self._buf, block * BLOCK)
            except OSError as e:
                self.in_write_since = None
                self.errors += 1
                err_since += 1
                text = f"{_errno.errorcode.get(e.errno, e.errno)}: {e.strerror}"
                self.first_error = self.first_error or text
                if not failing:
                    failing = True
                    self._io_record("errors", ok_since, err_since, text)
                    ok_since = err_since = 0
                self._stop.wait(0.05)  # a failing device answers at once: do not spin
                continue
            self.in_write_since = None
            self.pending[block].discard(gen)
            self.acked[block] = gen
            self.ok += 1
            ok_since += 1
            if failing:
                failing = False
                self._io_record("resumed", ok_since, err_since)
                ok_since = err_since = 0
            if time.monotonic() - last >= PROGRESS_S:
                self._io_record("progress", ok_since, err_since)
                ok_since = err_since = 0
                last = time.monotonic()

    def stop(self, deadline_s: float) -> dict:
        """Stops writing: written (acknowledged writes), errors, first_error, and blocked (a
        write still in the kernel after deadline_s, for blocked_ns)."""
        self._stop.set()
        self._thread.join(deadline_s)
        blocked = self._thread.is_alive()
        return {"written": self.ok, "errors": self.errors, "first_error": self.first_error,
                "blocked": blocked, "blocked_ns": (time.monotonic_ns() - self.in_write_since)
                if blocked and self.in_write_since else 0}

    def verify(self, device: str = "") -> dict:
        """Reads every block back and judges it (module docstring), from device (default the
        one written: a unit deleted and connected again may have a new name)."""
        device = device or self.device
        fd = os.open(device, os.O_RDONLY | os.O_DIRECT)
        buf = mmap.mmap(-1, BLOCK)
        lost, corrupt, pending, matched = [], [], 0, 0
        try:
            for block in range(self.blocks):
                os.preadv(fd, [buf], block * BLOCK)
                magic, run, b, gen = _HEAD.unpack_from(buf)
                acked = self.acked.get(block, 0)
                ours = magic == MAGIC and run == self.run
                if not ours:  # what was there before the ledger
                    if acked:  # though a write of ours was acknowledged
                        lost.append(block)
                elif b != block or bytes(buf) != _image(self.run, block, gen):
                    corrupt.append(block)
                elif gen == acked:
                    matched += 1
                elif gen in self.pending.get(block, ()) and gen > acked:
                    pending += 1
                elif gen < acked:
                    lost.append(block)
                else:
                    corrupt.append(block)
        finally:
            os.close(fd)
            buf.close()
        result = {"blocks": self.blocks, "acked": len(self.acked), "matched": matched,
                  "lost": lost[:20], "lost_count": len(lost), "corrupt": corrupt[:20],
                  "corrupt_count": len(corrupt), "pending": pending}
        self.lab.record(records.IO_VERIFY, object=self.workload, host=self.host,
                        device=device, **result)
        return result

    def close(self) -> None:
        self._stop.set()
        self._thread.join(1.0)
        if not self._thread.is_alive() and self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


@answered
def start(lab, workload: str, device: str, blocks: int, seed: int) -> dict:
    """A ledger writing to device from now on; its id for stop and verify."""
    ledger_id = next(_IDS)
    _LEDGERS[ledger_id] = Ledger(lab, workload, device, blocks, seed)
    lab.record(records.WORKLOAD, object=workload, host=host_name(lab), step="io_start",
               ok=True, took_ns=0, device=device, blocks=blocks)
    return {"ledger": ledger_id}


@answered
def stop(lab, ledger_id: int, deadline_s: float) -> dict:
    ledger = _LEDGERS[ledger_id]
    got = ledger.stop(deadline_s)
    lab.record(records.WORKLOAD, object=ledger.workload, host=host_name(lab), step="io_stop",
               ok=not got["blocked"], took_ns=0, **got)
    return got


@answered
def verify(lab, ledger_id: int, device: str = "") -> dict:
    ledger = _LEDGERS.pop(ledger_id)
    try:
        return ledger.verify(device)
    finally:
        ledger.close()
