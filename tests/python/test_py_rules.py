"""The model's wire rules take the fault switch's keys (faults/rules.h): direction, proto,
every, probability (seeded), besides the packet fields and count."""

from types import SimpleNamespace

import pytest

from rdmalab.faults import PacketRule


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
