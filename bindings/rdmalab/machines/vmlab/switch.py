"""A learning Ethernet switch on a unix datagram socket: the VMs' data fabric.

Each VM's qemu sends from its own bound socket (-netdev dgram,local.path=...) to the switch's
socket; one datagram is one Ethernet frame from the destination MAC on (no FCS, no padding).
The switch learns source MAC -> sender path from recvfrom, forwards known unicast, and floods
broadcast, multicast and unknown destinations to every other peer it knows (learned, or named
at start so that a VM that has not sent yet still gets ARP requests). A peer that is down
(ECONNREFUSED, ENOENT) is skipped; a malformed frame is counted and dropped.
With --pcap, every frame received is also written to a pcap file (Ethernet link type), for
reading the RoCEv2 and CM traffic with tcpdump or a test.
Run: python3 -m rdmalab.machines.vmlab.switch --sock sw.sock [--peer vm1.sock ...] [--pcap fabric.pcap]
"""
from __future__ import annotations

import argparse
import errno
import os
import select
import socket
import sys
import time
from typing import BinaryIO, Iterable

from . import pcap as pcap_mod

ETH_HEADER = 14
MAX_FRAME = 65536
DOWN_ERRNOS = (errno.ECONNREFUSED, errno.ENOENT, errno.EAGAIN, errno.ENOBUFS)


class Switch:
    """Forwarding decisions, apart from the socket so tests can drive it."""

    def __init__(self, peers: Iterable[str] = ()) -> None:
        self.peers: list[str] = list(dict.fromkeys(peers))
        self.table: dict[bytes, str] = {}
        self.dropped = 0

    def route(self, frame: bytes, sender: str) -> list[str]:
        """The peers this frame goes to; learns the sender. Empty for a frame to drop."""
        if len(frame) < ETH_HEADER or not sender:
            self.dropped += 1
            return []
        dst, src = frame[0:6], frame[6:12]
        if sender not in self.peers:
            self.peers.append(sender)
        if not src[0] & 1:  # a multicast source address is bogus: never learn it
            self.table[src] = sender
        if not dst[0] & 1 and dst in self.table:
            out = self.table[dst]
            return [] if out == sender else [out]
        return [p for p in self.peers if p != sender]


def serve(sock_path: str, peers: Iterable[str], stop_when_orphaned: bool = True,
          pcap: BinaryIO | None = None) -> None:
    sw = Switch(peers)
    parent = os.getppid()
    if os.path.exists(sock_path):
        os.unlink(sock_path)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(sock_path)
        sock.setblocking(False)
        print(f"switch: listening on {sock_path}", flush=True)
        while True:
            # Wake at least once a second to notice the controller has gone.
            ready, _, _ = select.select([sock], [], [], 1.0)
            if stop_when_orphaned and os.getppid() != parent:
                return
            if not ready:
                continue
            _pump(sock, sw, pcap)


def _pump(sock: socket.socket, sw: Switch, pcap: BinaryIO | None) -> None:
    while True:
        try:
            frame, sender = sock.recvfrom(MAX_FRAME)
        except BlockingIOError:
            if pcap is not None:
                pcap.flush()
            return
        if pcap is not None:
            pcap.write(pcap_mod.record(frame, time.time()))  # wall clock: pcap wants real time
        for out in sw.route(frame, sender if isinstance(sender, str) else ""):
            try:
                sock.sendto(frame, out)
            except OSError as exc:
                if exc.errno not in DOWN_ERRNOS:
                    print(f"switch: sendto {out}: {exc}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sock", required=True)
    ap.add_argument("--peer", action="append", default=[])
    ap.add_argument("--keep", action="store_true", help="do not exit when the parent goes")
    ap.add_argument("--pcap", help="write every frame received to this pcap file")
    args = ap.parse_args(argv)
    if args.pcap is None:
        serve(args.sock, args.peer, stop_when_orphaned=not args.keep)
        return
    with open(args.pcap, "wb") as pcap:
        pcap.write(pcap_mod.HEADER)
        serve(args.sock, args.peer, stop_when_orphaned=not args.keep, pcap=pcap)


if __name__ == "__main__":
    main()
