"""pcap files of the data fabric, and the RoCEv2 / CM fields the lab looks at.

Layout facts (docs/vmlab.md): IPv4, UDP destination port 4791, BTH (12 bytes: opcode, flags,
P_Key, dest QP in the low 24 bits of bytes 4-7, PSN in the low 24 bits of bytes 8-11). CM
messages are UD SEND_ONLY (0x64) to QP 1 with a DETH (8 bytes) and then a MAD whose management
class is 0x07 and whose attribute ID (MAD offset 16) names the message.
"""
from __future__ import annotations

import dataclasses
import pathlib
import struct
from typing import Iterator

MAGIC = 0xA1B2C3D4
LINKTYPE_ETHERNET = 1
SNAPLEN = 65536
HEADER = struct.pack("<IHHiIII", MAGIC, 2, 4, 0, 0, SNAPLEN, LINKTYPE_ETHERNET)

ROCE_V2_PORT = 4791
ETHERTYPE_IPV4 = 0x0800
IPPROTO_UDP = 17
BTH_LEN, DETH_LEN = 12, 8
UD_SEND_ONLY = 0x64
MGMT_CLASS_CM = 0x07
CM_ATTRS = {0x10: "REQ", 0x11: "MRA", 0x12: "REJ", 0x13: "REP", 0x14: "RTU", 0x15: "DREQ",
            0x16: "DREP"}


def record(frame: bytes, when: float) -> bytes:
    usec = int(round(when * 1e6))
    return struct.pack("<IIII", usec // 1_000_000, usec % 1_000_000, len(frame),
                       len(frame)) + frame


def read(path: pathlib.Path) -> Iterator[tuple[float, bytes]]:
    """(timestamp, frame) for each record; stops quietly at a torn last record."""
    data = path.read_bytes()
    if len(data) < len(HEADER) or struct.unpack_from("<I", data)[0] != MAGIC:
        raise ValueError(f"{path}: not a little-endian pcap file")
    pos = len(HEADER)
    while pos + 16 <= len(data):
        sec, usec, incl, _ = struct.unpack_from("<IIII", data, pos)
        if pos + 16 + incl > len(data):
            return
        yield sec + usec / 1e6, data[pos + 16:pos + 16 + incl]
        pos += 16 + incl


@dataclasses.dataclass(frozen=True)
class Bth:
    opcode: int
    dest_qp: int
    psn: int
    payload: bytes  # after the BTH, ICRC included


def bth(frame: bytes) -> Bth | None:
    """The BTH of a RoCEv2 frame (IPv4, UDP port 4791), or None for any other frame."""
    if len(frame) < 14 + 20 or struct.unpack_from("!H", frame, 12)[0] != ETHERTYPE_IPV4:
        return None
    ihl = (frame[14] & 0x0F) * 4
    if frame[14 + 9] != IPPROTO_UDP:
        return None
    udp = 14 + ihl
    if len(frame) < udp + 8 + BTH_LEN or struct.unpack_from("!H", frame, udp + 2)[0] != \
            ROCE_V2_PORT:
        return None
    b = udp + 8
    return Bth(opcode=frame[b], dest_qp=struct.unpack_from("!I", frame, b + 4)[0] & 0xFFFFFF,
               psn=struct.unpack_from("!I", frame, b + 8)[0] & 0xFFFFFF,
               payload=frame[b + BTH_LEN:])


def cm_message(frame: bytes) -> str | None:
    """REQ, REP, RTU, DREQ, DREP... for a CM MAD on QP 1, else None."""
    h = bth(frame)
    if h is None or h.opcode != UD_SEND_ONLY or h.dest_qp != 1:
        return None
    mad = h.payload[DETH_LEN:]
    if len(mad) < 18 or mad[1] != MGMT_CLASS_CM:
        return None
    return CM_ATTRS.get(struct.unpack_from("!H", mad, 16)[0], "CM?")
