"""Wire rules as nftables rules in the guests (rdmalab.faults.nft): the match expressions for the
rule language's fields, checked by nft itself (`nft -c`, no kernel table touched)."""

import os
import shutil
import subprocess

import json

import pytest

from rdmalab import FaultNotSupported, _core
from rdmalab.faults import nft
from rdmalab.labs.agent import sinks

HOSTS = {"a": "10.0.0.1", "b": "10.0.0.2"}


def nft_accepts(expr: str) -> None:
    if shutil.which("nft") is None:
        pytest.skip("nft is not installed (Debian package nftables)")
    ruleset = (f"table inet {nft.TABLE} {{\n chain {nft.CHAIN} {{\n"
               " type filter hook output priority 0 ; policy accept ;\n"
               f" {expr} counter drop comment \"t\"\n }}\n}}\n")
    r = subprocess.run(["nft", "-c", "-f", "-"], input=ruleset, text=True,
                       capture_output=True, timeout=30)
    assert r.returncode == 0, f"nft refused {expr!r}: {r.stderr}"


def test_drep_is_a_ud_mad_to_qp1_with_attribute_0x16():
    expr = nft.match_expr({"opcode": "MAD", "mad_attr_id": 0x16}, HOSTS)
    # BTH opcode at UDP payload byte 0, dest QPN at 5..7, MAD attribute at 12 + 8 + 16 = 36.
    assert "udp dport 4791" in expr
    assert "@th,64,8 0x64" in expr and "@th,104,24 1" in expr and "@th,352,16 0x0016" in expr
    nft_accepts(expr)


def test_rc_opcode_qpn_psn_and_destination():
    expr = nft.match_expr({"opcode": "SEND_ONLY", "dest_qpn": 0x12, "psn": 7,
                           "dst_host": "b", "src_host": "a"}, HOSTS)
    assert "ip daddr 10.0.0.2" in expr and "@th,64,8 0x04" in expr
    assert "@th,104,24 0x12" in expr and "@th,136,24 0x7" in expr
    nft_accepts(expr)


def test_tcp_flags_for_iwarp():
    expr = nft.match_expr({"tcp_flags": "FIN|ACK"}, HOSTS)
    assert expr == "meta l4proto tcp tcp flags & (fin|ack) == fin|ack"
    nft_accepts(expr)


def test_iwarp_rules_match_tcp_on_the_data_nic_only():
    expr = nft.match_expr({"src_host": "a"}, HOSTS, "iwarp", "eth0")
    assert expr == 'oifname "eth0" meta l4proto tcp'
    nft_accepts(expr)
    with pytest.raises(FaultNotSupported, match="RoCEv2 fields"):
        nft.match_expr({"opcode": "SEND_ONLY"}, HOSTS, "iwarp")
    roce = nft.match_expr({"src_host": "a"}, HOSTS, "roce", "eth0")
    assert roce == 'oifname "eth0" udp dport 4791'
    nft_accepts(roce)


def test_bad_fields_are_clear_errors():
    with pytest.raises(ValueError, match="opcode 'SEND_SOMETIMES'"):
        nft.match_expr({"opcode": "SEND_SOMETIMES"}, HOSTS)
    with pytest.raises(ValueError, match="dst_host 'c'"):
        nft.match_expr({"dst_host": "c"}, HOSTS)
    with pytest.raises(ValueError, match="tcp_flags"):
        nft.match_expr({"tcp_flags": "FIN|NOPE"}, HOSTS)
    with pytest.raises(FaultNotSupported, match="syndrome"):
        nft.match_expr({"opcode": "ACKNOWLEDGE", "syndrome": "RNR_NAK"}, HOSTS)


# A value of each key nftables expresses, as a rule of the switch's language would give it.
SAMPLE = {"src_host": "a", "dst_host": "b", "tcp_flags": "FIN", "opcode": "SEND_ONLY",
          "mad_attr_id": 0x16, "dest_qpn": 0x12, "psn": 7}


def test_every_key_nftables_expresses_is_a_key_of_the_switchs_language():
    """The switch's parser (faults/rules.cc) is the one home of the rule language: each key
    the nftables translation knows is one it accepts, with the same kind of value."""
    assert set(SAMPLE) == set(nft.MATCH_KEYS)
    for key, value in SAMPLE.items():
        _core.check_wire_rule(json.dumps({"action": "drop", key: value}))


def test_a_key_of_the_language_nftables_cannot_express_is_refused_by_name():
    for key, value in (("src_qpn", 5), ("transport", "RC")):
        _core.check_wire_rule(json.dumps({"action": "drop", key: value}))  # the language's
        with pytest.raises(FaultNotSupported, match=key):
            nft.match_expr({key: value}, HOSTS)


def test_handle_and_counter_parsing():
    assert nft.parse_handle("add rule inet rdmalab out udp dport 4791 counter drop # handle 7") == 7
    assert nft.parse_handle("nothing") is None
    listing = ('{"nftables": [{"metainfo": {}}, {"rule": {"handle": 7, "expr": '
               '[{"match": {}}, {"counter": {"packets": 17, "bytes": 1000}}, {"drop": null}]}}]}')
    assert nft.rule_packets(listing, 7) == 17
    assert nft.rule_packets(listing, 8) == 0


def test_bridge_place_matches_the_sender_by_address():
    """In a bridge every host's packets pass one rule set: src_host becomes the sender's
    address, and no output interface is named (the netns lab's default place)."""
    expr = nft.match_expr({"src_host": "a", "mad_attr_id": 0x16}, HOSTS, "roce", None, nft.BRIDGE)
    assert expr.startswith(f"ip saddr {HOSTS['a']} udp dport 4791")
    assert "oifname" not in expr
    assert "ip saddr" not in nft.match_expr({"src_host": "a"}, HOSTS, "roce", "eth0", nft.HOST)
    assert "table bridge rdmalab" not in nft.setup_commands(nft.HOST)
    assert nft.setup_commands(nft.BRIDGE) == (
        "nft add table bridge rdmalab && nft add chain bridge rdmalab wire "
        "'{ type filter hook forward priority 0 ; policy accept ; }'")
    assert nft.delete_rule_command(7, nft.BRIDGE) == "nft delete rule bridge rdmalab wire handle 7"
    with pytest.raises(ValueError, match="src_host 'z'"):
        nft.match_expr({"src_host": "z"}, HOSTS, "roce", None, nft.BRIDGE)
    # With the hosts' MACs: RoCEv2 over an IPv6 GID is matched too.
    macs = {"a": "52:54:00:77:00:01", "b": "52:54:00:77:00:02"}
    expr = nft.match_expr({"src_host": "a", "dst_host": "b"}, HOSTS, "roce", None, nft.BRIDGE,
                          macs)
    assert expr == ("ether saddr 52:54:00:77:00:01 ether daddr 52:54:00:77:00:02 "
                    "udp dport 4791")
    assert "ip daddr" in nft.match_expr({"dst_host": "b"}, HOSTS, "roce", "eth0", nft.HOST, macs)


class NsMachine:
    """A machine that is a network namespace of this one: bytes pipes, as the SSH machines."""

    def __init__(self, ns: str) -> None:
        self.ns = ns

    def popen(self, cmd: str, *, root: bool = False, stdin: bool = False):
        return subprocess.Popen(["ip", "netns", "exec", self.ns, "sh", "-c", cmd],
                                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def sh(self, cmd: str) -> None:
        subprocess.run(["ip", "netns", "exec", self.ns, "sh", "-c", cmd], check=True, timeout=30)


@pytest.fixture
def ns_machine():
    if shutil.which("nft") is None or shutil.which("ip") is None:
        pytest.skip("needs nft and ip (Debian packages nftables, iproute2)")
    ns = f"rl-nft-{os.getpid()}"
    if subprocess.run(["ip", "netns", "add", ns], capture_output=True).returncode != 0:
        pytest.skip("cannot create a network namespace here (needs root)")
    m = NsMachine(ns)
    try:
        m.sh("ip link set lo up && " + nft.setup_commands(nft.HOST) + " && "
             f"nft add rule inet {nft.TABLE} {nft.CHAIN} udp dport 4791 counter")
        yield m
    finally:
        subprocess.run(["ip", "netns", "delete", ns], timeout=30)


def send_udp(m: NsMachine, n: int) -> None:
    m.sh(f"/usr/bin/python3 -c \"import socket; s = socket.socket(socket.AF_INET, "
         f"socket.SOCK_DGRAM); [s.sendto(b'x', ('127.0.0.1', 4791)) for _ in range({n})]\"")


def rule_handle(listing: str) -> int:
    import json
    return next(i["rule"]["handle"] for i in json.loads(listing)["nftables"] if "rule" in i)


def test_lister_reads_counters_from_one_nft_process(ns_machine):
    """sinks.Lister: each read is one line to the same `nft -j -i`, and sees the counter move."""
    lister = sinks.Lister(ns_machine)
    try:
        send_udp(ns_machine, 3)
        first = lister.read(nft.HOST)
        assert first is not None
        handle = rule_handle(first)
        assert nft.rule_packets(first, handle) == 3
        pid = lister._proc.pid
        send_udp(ns_machine, 2)
        assert nft.rule_packets(lister.read(nft.HOST), handle) == 5
        assert lister._proc.pid == pid and lister._proc.poll() is None
    finally:
        lister.close()


def test_lister_gives_up_on_an_error_and_the_caller_falls_back(ns_machine):
    """A listing nft cannot answer (the table is gone) ends the lister: None, process gone."""
    lister = sinks.Lister(ns_machine)
    ns_machine.sh(nft.delete_table_command(nft.HOST))
    assert lister.read(nft.HOST) is None
    assert lister._proc is None
    assert lister.read(nft.HOST) is None
