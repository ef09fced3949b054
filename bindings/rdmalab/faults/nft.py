"""Wire-fault rules as nftables rules (faults where the project's switch is not on the wire), in
one of two places:

- HOST: the sending host's `output` hook. Software providers (rxe, siw) send through the
  host's network stack, so it sees every RoCEv2 packet (UDP 4791) and every iWARP segment (TCP)
  the device sends. Hardware RoCE (mlx5) bypasses the stack: there this does not apply. A drop
  here is a local send failure the provider sees (ip_local_out fails): not what a lossy wire
  does (rxe moves the sending QP, QP1 included, to ERR: docs/semantics.md I).
- BRIDGE: the `forward` hook of a Linux bridge the hosts' traffic crosses (the netns lab's
  bridge, an nftables bridge host): as the fault switch, the sender's stack never knows.

The rule language is the fault switch's (faults/rules.cc parses it; rdmalab.faults.wire checks
every rule with that parser before a sink sees it). nftables expresses MATCH_KEYS of it:
opcode, dest_qpn, psn, mad_attr_id (cm="DREP"), src_host, dst_host, plus tcp_flags for iWARP; a
key it cannot express raises FaultNotSupported naming it (test_py_nft checks MATCH_KEYS against
the parser).

Offsets are from the transport header (`@th`, in bits): UDP is 8 bytes, then BTH (12 bytes:
opcode at byte 0, destination QPN at bytes 5-7, PSN at 9-11), then for QP1's UD MADs a DETH
(8 bytes), then the MAD, whose attribute ID is at byte 16 (IBTA vol. 1, 9.2 and 13.4).
"""

from __future__ import annotations

import json
from typing import Mapping, Optional

from ..errors import FaultNotSupported

# The keys of the switch's rule language this translation expresses.
MATCH_KEYS = ("src_host", "dst_host", "tcp_flags", "opcode", "mad_attr_id", "dest_qpn", "psn")
TABLE = "rdmalab"
CHAIN = "out"


class Place:
    """Where a rule set lives: family, chain, hook, and whether it matches the sender by its
    address (a bridge sees every host's packets) or by being in its output hook."""

    def __init__(self, name: str, family: str, chain: str, hook: str, by_source: bool):
        self.name, self.family, self.chain, self.hook = name, family, chain, hook
        self.by_source = by_source

    def __repr__(self) -> str:
        return f"<nft place {self.name}: {self.family} {self.chain} ({self.hook})>"


HOST = Place("host", "inet", CHAIN, "output", by_source=False)
BRIDGE = Place("bridge", "bridge", "wire", "forward", by_source=True)  # "fwd" is an nft keyword
ROCE_PORT = 4791
UDP_HDR = 8
BTH_LEN = 12
DETH_LEN = 8

# IBTA vol. 1 table 38, RC opcodes (transport 0x00) and UD SEND_ONLY (0x64) for MADs.
BTH_OPCODE = {
    "SEND_FIRST": 0x00, "SEND_MIDDLE": 0x01, "SEND_LAST": 0x02,
    "SEND_LAST_WITH_IMMEDIATE": 0x03, "SEND_ONLY": 0x04, "SEND_ONLY_WITH_IMMEDIATE": 0x05,
    "RDMA_WRITE_FIRST": 0x06, "RDMA_WRITE_MIDDLE": 0x07, "RDMA_WRITE_LAST": 0x08,
    "RDMA_WRITE_LAST_WITH_IMMEDIATE": 0x09, "RDMA_WRITE_ONLY": 0x0A,
    "RDMA_WRITE_ONLY_WITH_IMMEDIATE": 0x0B, "RDMA_READ_REQUEST": 0x0C,
    "RDMA_READ_RESPONSE_FIRST": 0x0D, "RDMA_READ_RESPONSE_MIDDLE": 0x0E,
    "RDMA_READ_RESPONSE_LAST": 0x0F, "RDMA_READ_RESPONSE_ONLY": 0x10, "ACKNOWLEDGE": 0x11,
    "ATOMIC_ACKNOWLEDGE": 0x12, "COMPARE_SWAP": 0x13, "FETCH_ADD": 0x14, "MAD": 0x64,
}
TCP_FLAGS = ("fin", "syn", "rst", "psh", "ack", "urg")


def _bits(byte_offset: int) -> int:
    return (UDP_HDR + byte_offset) * 8


def match_expr(fields: Mapping, addresses: Mapping[str, str], transport: str = "roce",
               netdev: Optional[str] = None, place: Place = HOST,
               macs: Optional[Mapping[str, str]] = None) -> str:
    """The nft match expression for a rule's fields (without the verdict). transport "roce"
    matches RoCEv2 (UDP 4791), "iwarp" the TCP segments iWARP runs on; netdev restricts the
    rule to the data NIC, so the control channel is never hit. In a host's output hook the
    rule sits in the sending host; in a bridge (place BRIDGE) src_host and dst_host are the
    hosts' MACs where `macs` has them (RoCEv2 may run over IPv6 link-local GIDs as well as
    IPv4-mapped ones: the MAC matches both), else their IPv4 addresses."""
    if transport not in ("roce", "iwarp"):
        raise ValueError(f"transport {transport!r}: roce or iwarp")
    fields = dict(fields)
    src = fields.pop("src_host", None)
    parts: list[str] = [f'oifname "{netdev}"'] if netdev else []
    if src is not None and place.by_source:
        parts.append(_host_match("src_host", src, "saddr", addresses, macs))
    tcp_flags = fields.pop("tcp_flags", None)
    dst = fields.pop("dst_host", None)
    if dst is not None:
        parts.append(_host_match("dst_host", dst, "daddr", addresses,
                                 macs if place.by_source else None))
    if transport == "iwarp" and tcp_flags is None:
        if fields:
            raise FaultNotSupported("nft", f"field(s) {sorted(fields)} are RoCEv2 fields: on "
                                    "iWARP only tcp_flags, src_host and dst_host")
        return " ".join(parts + ["meta l4proto tcp"])
    if tcp_flags is not None:
        if fields:
            raise FaultNotSupported("nft", f"tcp_flags cannot be combined with {sorted(fields)}")
        wanted = [f.strip().lower() for f in str(tcp_flags).split("|") if f.strip()]
        bad = [f for f in wanted if f not in TCP_FLAGS]
        if bad:
            raise ValueError(f"tcp_flags {tcp_flags!r}: unknown {bad}; known: {TCP_FLAGS}")
        mask = "|".join(wanted)
        return " ".join(parts + [f"meta l4proto tcp tcp flags & ({mask}) == {mask}"])
    parts.append(f"udp dport {ROCE_PORT}")
    opcode = fields.pop("opcode", None)
    mad_attr = fields.pop("mad_attr_id", None)
    if opcode is not None:
        if opcode not in BTH_OPCODE:
            raise ValueError(f"opcode {opcode!r}: unknown; known: {', '.join(BTH_OPCODE)}")
        parts.append(f"@th,{_bits(0)},8 {BTH_OPCODE[opcode]:#04x}")
    if opcode == "MAD" or mad_attr is not None:
        # CM MADs go to QP1 as UD SENDs: the attribute ID sits after BTH, DETH and 16 MAD bytes.
        parts.append(f"@th,{_bits(5)},24 1")
        if mad_attr is not None:
            parts.append(f"@th,{_bits(BTH_LEN + DETH_LEN + 16)},16 {int(mad_attr):#06x}")
    qpn = fields.pop("dest_qpn", None)
    if qpn is not None:
        parts.append(f"@th,{_bits(5)},24 {int(qpn):#x}")
    psn = fields.pop("psn", None)
    if psn is not None:
        parts.append(f"@th,{_bits(9)},24 {int(psn):#x}")
    if fields:
        raise FaultNotSupported(
            "nft", f"field(s) {sorted(fields)} have no nftables match here (the fault switch "
            "parses them)")
    return " ".join(parts)


def _host_match(field: str, host: str, which: str, addresses: Mapping[str, str],
                macs: Optional[Mapping[str, str]]) -> str:
    if host not in addresses:
        raise ValueError(f"{field} {host!r}: no such host ({', '.join(addresses)})")
    if macs and macs.get(host):
        return f"ether {which} {macs[host]}"
    return f"ip {which} {addresses[host]}"


def setup_commands(place: Place = HOST) -> str:
    """Creates the table and the place's chain (idempotent)."""
    return (f"nft add table {place.family} {TABLE} && nft add chain {place.family} {TABLE} "
            f"{place.chain} '{{ type filter hook {place.hook} priority 0 ; policy accept ; }}'")


def add_rule_command(expr: str, verdict: str, comment: str, place: Place = HOST) -> str:
    """Adds a rule with a counter; --echo --handle prints its handle."""
    return (f"nft --echo --handle add rule {place.family} {TABLE} {place.chain} {expr} counter "
            f"{verdict} comment '\"{comment}\"'")


def list_command(place: Place = HOST) -> str:
    return f"nft -j list chain {place.family} {TABLE} {place.chain}"


def delete_rule_command(handle: int, place: Place = HOST) -> str:
    return f"nft delete rule {place.family} {TABLE} {place.chain} handle {handle}"


def delete_table_command(place: Place = HOST) -> str:
    return f"nft delete table {place.family} {TABLE}"


def parse_handle(output: str) -> Optional[int]:
    marker = "# handle "
    for line in output.splitlines():
        if marker in line:
            return int(line.rsplit(marker, 1)[1].split()[0])
    return None


def rule_packets(listing_json: str, handle: int) -> int:
    """Packets counted by the rule with this handle, from `nft -j list chain ...`."""
    for item in json.loads(listing_json).get("nftables", []):
        rule = item.get("rule")
        if not rule or rule.get("handle") != handle:
            continue
        for stmt in rule.get("expr", []):
            if "counter" in stmt:
                return int(stmt["counter"].get("packets", 0))
    return 0


def list_line(place: Place = HOST) -> str:
    """The listing command as `nft -i` reads it (rdmalab.labs.agent.sinks.Lister)."""
    return f"list chain {place.family} {TABLE} {place.chain}\n"
