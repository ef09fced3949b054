"""The model's wire rules take the fault switch's keys (faults/rules.h): direction, proto,
tcp_flags, rdmap_opcode, every, probability (seeded), besides the packet fields and count; and
the switch's reorder."""

from types import SimpleNamespace

import pytest

import rdmalab
from rdmalab import ms, sec
from rdmalab.faults import PacketRule
from rdmalab.resources import CmPair, RCPair


def pkt(opcode="SEND_ONLY", src="a", dst="b", **kw):
    fields = dict(src_host=src, dst_host=dst, opcode=opcode, dest_qpn=0x12, src_qpn=0,
                  psn=0, syndrome="", mad_attr_id=0)
    fields.update(kw)
    return SimpleNamespace(**fields)


def taken(rule, packets):
    out = []
    for p in packets:
        if rule.matches(p):
            rule.verdict()
            out.append(True)
        else:
            out.append(False)
    return out


def test_every_kth_match_is_taken():
    rule = PacketRule("DROP", None, {"opcode": "SEND_ONLY"}, None, every=3)
    got = taken(rule, [pkt(), pkt(opcode="ACKNOWLEDGE"), pkt(), pkt(), pkt(), pkt(), pkt()])
    # the ACKNOWLEDGE does not match, so it does not count towards every=
    assert got == [False, False, False, True, False, False, True]
    assert rule.hits == 2


def test_probability_is_seeded_and_bounded():
    draws = lambda seed: taken(PacketRule("DROP", None, {}, None, probability=0.5, seed=seed),  # noqa: E731
                               [pkt()] * 200)
    assert draws(7) == draws(7)                      # a seed replays
    assert draws(7) != draws(8)
    assert 60 < sum(draws(7)) < 140
    assert not any(taken(PacketRule("DROP", None, {}, None, probability=0.0), [pkt()] * 50))
    assert all(taken(PacketRule("DROP", None, {}, None, probability=1.0), [pkt()] * 50))


def test_count_with_every_takes_the_first_n_of_those_chosen():
    rule = PacketRule("DROP", None, {}, 2, every=2)
    assert taken(rule, [pkt()] * 8) == [False, True, False, True, False, False, False, False]


def test_direction_and_proto():
    one_way = PacketRule("DROP", None, {"direction": "a->b"}, None)
    both = PacketRule("DROP", None, {"direction": "a<->b"}, None)
    assert taken(one_way, [pkt(src="a", dst="b"), pkt(src="b", dst="a")]) == [True, False]
    assert taken(both, [pkt(src="a", dst="b"), pkt(src="b", dst="a"), pkt(src="a", dst="c")]) \
        == [True, True, False]
    iwarp = PacketRule("DROP", None, {"proto": "iwarp"}, None)
    roce = PacketRule("DROP", None, {"proto": "roce"}, None)
    packets = [pkt(opcode="TCP_FIN"), pkt(opcode="MPA_REQUEST"), pkt(opcode="SEND_ONLY")]
    assert taken(iwarp, packets) == [True, True, False]
    assert taken(roce, packets) == [False, False, True]


def test_bad_keys_are_clear_errors():
    with pytest.raises(ValueError, match="direction"):
        PacketRule("DROP", None, {"direction": "a-b"}, None)
    with pytest.raises(ValueError, match="proto"):
        PacketRule("DROP", None, {"proto": "udp"}, None)
    with pytest.raises(ValueError, match="every"):
        PacketRule("DROP", None, {}, None, every=0)
    with pytest.raises(ValueError, match="probability"):
        PacketRule("DROP", None, {}, None, probability=1.5)
    with pytest.raises(TypeError, match="unknown packet field"):
        PacketRule("DROP", None, {"colour": "red"}, None)


# -- tcp_flags and rdmap_opcode: the headers the model's packets stand for

IWARP = {"a", "b"}
TCP_CM = ["TCP_FIN", "TCP_ACK", "TCP_RST", "MPA_REQUEST", "MPA_REPLY"]


def flags_rule(flags, iwarp_hosts=IWARP):
    return PacketRule("DROP", None, {"tcp_flags": flags}, None, iwarp_hosts=iwarp_hosts)


def test_tcp_flags_are_bits_set_others_free():
    packets = [pkt(opcode=o) for o in TCP_CM] + [pkt(opcode="SEND_ONLY")]
    assert taken(flags_rule("FIN"), packets) == [True, False, False, False, False, False]
    assert taken(flags_rule("RST|ACK"), packets) == [False, False, True, False, False, False]
    assert taken(flags_rule("FIN|RST"), packets) == [False] * 6
    # every segment after the handshake carries ACK, the FPDUs (SEND_ONLY) included
    assert taken(flags_rule("ACK"), packets) == [True] * 6


def test_tcp_flags_the_model_never_sends_match_nothing():
    packets = [pkt(opcode=o) for o in TCP_CM + ["SEND_ONLY", "ACKNOWLEDGE"]]
    for flags in ("SYN", "SYN|ACK", "PSH", "URG", "ECE", "CWR"):
        assert not any(taken(flags_rule(flags), packets)), flags
    # IB and RoCE packets are not on TCP
    roce = [pkt(opcode="SEND_ONLY"), pkt(opcode="ACKNOWLEDGE", syndrome="ACK"), pkt(opcode="MAD")]
    assert not any(taken(flags_rule("ACK", iwarp_hosts=()), roce))


def test_rdmap_opcode_names_the_iwarp_data_packets():
    packets = [pkt(opcode="SEND_ONLY"), pkt(opcode="SEND_ONLY_WITH_IMMEDIATE"),
               pkt(opcode="RDMA_WRITE_ONLY"), pkt(opcode="RDMA_READ_REQUEST"),
               pkt(opcode="RDMA_READ_RESPONSE_ONLY"),
               pkt(opcode="ACKNOWLEDGE", syndrome="ACK"),
               pkt(opcode="ACKNOWLEDGE", syndrome="NAK_REM_ACCESS"), pkt(opcode="TCP_FIN")]

    def rule(op, iwarp_hosts=IWARP):
        return PacketRule("DROP", None, {"rdmap_opcode": op}, None, iwarp_hosts=iwarp_hosts)

    F, T = False, True
    assert taken(rule("SEND"), packets) == [T, T, F, F, F, F, F, F]
    assert taken(rule(3), packets) == [T, T, F, F, F, F, F, F]  # the 4-bit value
    assert taken(rule("RDMA_WRITE"), packets) == [F, F, T, F, F, F, F, F]
    assert taken(rule("RDMA_READ_REQUEST"), packets) == [F, F, F, T, F, F, F, F]
    assert taken(rule("RDMA_READ_RESPONSE"), packets) == [F, F, F, F, T, F, F, F]
    assert taken(rule("TERMINATE"), packets) == [F, F, F, F, F, F, T, F]
    # no solicited event, no invalidate, no RFC 7306 messages on the model; no RDMAP on RoCE
    for op in ("SEND_WITH_SE", "SEND_WITH_INVALIDATE", "SEND_WITH_SE_AND_INVALIDATE", 8, 15):
        assert not any(taken(rule(op), packets)), op
    assert not any(taken(rule("SEND", iwarp_hosts=()), packets))


def test_bad_tcp_flags_and_rdmap_opcode_list_the_allowed_values():
    for bad in ("FIN|NOPE", "fin", "", "FIN|", "SYN ACK", 1, ["FIN"]):
        with pytest.raises(ValueError, match=r"tcp_flags=.*FIN, SYN, RST, PSH, ACK, URG, ECE, CWR"):
            PacketRule("DROP", None, {"tcp_flags": bad}, None)
    for bad in ("WRITE", "send", 16, -1, True, 3.0):
        with pytest.raises(ValueError, match=r"rdmap_opcode=.*RDMA_WRITE, .*TERMINATE or the "
                                             r"4-bit value 0\.\.15"):
            PacketRule("DROP", None, {"rdmap_opcode": bad}, None)
    with pytest.raises(ValueError, match="hold_ns"):
        PacketRule("REORDER", None, {}, None, hold_ns=-1)
    with pytest.raises(TypeError, match="tcp_flags, rdmap_opcode"):
        PacketRule("DROP", None, {"tcp_flag": "FIN"}, None)


def test_fin_rule_drops_exactly_the_fins_on_iwarp():
    """A client's close on iWARP with every FIN lost: the server hears nothing until the
    client's endpoint gives up and aborts (its RST has no FIN bit and goes through): cxgb4,
    whose close waits (siw reports it at once and leaves the peer half-open)."""
    with rdmalab.model_lab(seed=3, hosts={"a": "iwarp-cxgb4", "b": "iwarp-cxgb4"}) as lab:
        pair = CmPair(lab)
        seen = []
        lab.faults.watch(lambda p: seen.append(p.opcode) or True)
        fins = lab.faults.drop(tcp_flags="FIN")
        pair.client.conn.disconnect()
        lab.run_for(ms(100))
        assert seen.count("TCP_FIN") == fins.hits == 1
        assert pair.server.conn.count("DISCONNECTED") == 0
        pair.server.conn.wait("DISCONNECTED", sec(61))  # the iWARP endpoint timeout, then RST
        assert "TCP_RST" in seen and fins.hits == seen.count("TCP_FIN")
        drops = [r["data"] for r in lab.history() if r["kind"] == "fault"
                 and r["data"]["fault"] == "drop"]
        assert [d["opcode"] for d in drops] == ["TCP_FIN"]


def test_rdmap_opcode_takes_the_iwarp_send_and_terminate():
    with rdmalab.model_lab(seed=3, hosts={"a": "iwarp-siw", "b": "iwarp-siw"}) as lab:
        pair = CmPair(lab)
        sends = lab.faults.watch(rdmap_opcode="SEND")
        terminates = lab.faults.watch(rdmap_opcode="TERMINATE")
        pair.server.post_recv(length=8)
        pair.client.post_send(length=8)
        assert pair.server.wait_completions(1, ms(10)) and pair.client.wait_completions(1, ms(10))
        assert (sends.hits, terminates.hits) == (1, 0)
        # an RDMA WRITE with a bad rkey: the responder terminates the stream
        pair.client.post_send(length=8, opcode="RDMA_WRITE", remote_addr=pair.server.mr.addr,
                              rkey=pair.server.mr.rkey + 1)
        assert pair.client.wait_completions(1, ms(10))  # siw: at once, handed to TCP
        lab.run_for(ms(1))
        assert terminates.hits == 1


def test_rdmap_opcode_matches_nothing_on_roce():
    with rdmalab.model_lab(seed=3, hosts={"a": "roce", "b": "roce"}) as lab:
        pair = RCPair(lab)
        sends = lab.faults.watch(rdmap_opcode="SEND")
        acks = lab.faults.watch(tcp_flags="ACK")
        pair.b.post_recv(length=8)
        pair.a.post_send(length=8)
        assert pair.b.wait_completions(1, ms(10)) and pair.a.wait_completions(1, ms(10))
        assert (sends.hits, acks.hits) == (0, 0)


# -- reorder: the switch's hold-until-the-next-of-the-flow

def ib_lab(seed=1):
    return rdmalab.model_lab(seed=seed, hosts={"a": "ib", "b": "ib"})


def reorder_run(lab, hold_ns=None):
    """Two SENDs on one RC QP, the first one reordered."""
    pair = RCPair(lab)
    rule = lab.faults.reorder(opcode="SEND_ONLY", count=1, hold_ns=hold_ns)
    pair.a.mr.write(0, b"first...second..")
    for i in range(2):
        pair.b.post_recv(length=8, offset=8 * i, wr_id=20 + i)
    for i in range(2):
        pair.a.post_send(length=8, offset=8 * i, wr_id=10 + i)
    assert pair.a.wait_completions(2, ms(10)) and pair.b.wait_completions(2, ms(10))
    return pair, rule


def test_reorder_delivers_after_the_next_packet_of_the_qp():
    """The first SEND reaches the responder after the second: a sequence gap (NAK_SEQ and a
    go-back-N retransmission), and each message still lands once, in order."""
    with ib_lab() as lab:
        pair, rule = reorder_run(lab)
        history = lab.history()
        held = [r["data"] for r in history if r["kind"] == "fault"
                and r["data"]["fault"] == "reorder"]
        released = [r["data"] for r in history if r["kind"] == "reorder_release"]
        assert rule.hits == 1 and lab.faults.counts()["reorder"] == 1
        assert len(held) == 1 and held[0]["hold_ns"] == ms(100)  # the switch's default
        assert len(released) == 1 and released[0]["packet"] == held[0]["packet"]
        assert released[0]["released_by"] == "packet"
        assert released[0]["after"] == held[0]["packet"] + 1  # the second SEND
        retransmits = [r["data"] for r in history if r["kind"] == "retransmit"]
        assert retransmits and retransmits[0]["cause"] == "NAK_SEQ"
        assert pair.b.mr.read(0, 16) == b"first...second.."
        assert pair.b.traffic.check().exactly_once()


def test_reorder_sends_at_hold_ns_when_the_flow_is_quiet():
    with ib_lab() as lab:
        pair = RCPair(lab)
        lab.faults.reorder(opcode="SEND_ONLY", count=1, hold_ns=ms(5))
        pair.b.post_recv(length=8)
        t0 = lab.now_ns
        pair.a.post_send(length=8)
        assert pair.b.wait_completions(1, ms(10))
        assert lab.now_ns - t0 >= ms(5)
        released = [r["data"] for r in lab.history() if r["kind"] == "reorder_release"]
        assert [r["released_by"] for r in released] == ["deadline"]


def test_reorder_same_seed_same_history():
    def run():
        with ib_lab(seed=9) as lab:
            reorder_run(lab)
            return lab._o.history_jsonl()

    first = run()
    assert '"kind":"reorder_release"' in first and first == run()


def _rec(n, kind, **data):
    return {"seq": n, "t_ns": n, "host": "switch", "object": "rule:1", "kind": kind,
            "data": data}


def test_holds_released_checks_each_hold_once():
    from rdmalab import checks
    ok = [_rec(0, "switch_reorder", seq=5), _rec(1, "switch_delay", seq=6),
          _rec(2, "switch_release", of_seq=6), _rec(3, "switch_release", of_seq=5)]
    assert checks.holds_released(ok)
    lost = ok[:3]
    res = checks.holds_released(lost)
    assert res.valid is False and "hold 5" in res.problems[0]
    twice = ok + [_rec(4, "switch_release", of_seq=6)]
    assert checks.holds_released(twice).valid is False
    stray = ok + [_rec(4, "switch_release", of_seq=9)]
    assert checks.holds_released(stray).valid is False
    assert checks.holds_released([]).valid is None


def test_holds_released_on_a_model_history():
    from rdmalab import checks
    with ib_lab() as lab:
        reorder_run(lab)
        res = checks.holds_released(lab.history())
        assert res and res.details["held"] == 1
