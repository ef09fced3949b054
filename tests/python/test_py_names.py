"""Enum and flag parsing, and the requests built from keywords (no lab needed)."""

import pytest

import rdmalab
from rdmalab import _core
from rdmalab.names import access_flags, parse, parse_gid
from rdmalab.api.requests import make_modify, make_send_wr


def test_enum_names_are_the_spec_names():
    assert _core.QpState.RTS.name == "RTS"
    assert _core.Transport.iWARP.name == "iWARP"
    assert _core.AsyncEventType.QP_LAST_WQE_REACHED.name == "QP_LAST_WQE_REACHED"
    assert int(_core.WcStatus.WR_FLUSH_ERR) == 5  # IBV_WC_WR_FLUSH_ERR
    assert list(_core.QpType.__members__) == ["RC", "UD", "XRC_SEND", "XRC_RECV"]


def test_parse_accepts_names_and_members():
    assert parse(_core.QpType, "RC", "QP type") == _core.QpType.RC
    assert parse(_core.QpState, "rts", "QP state") == _core.QpState.RTS
    assert parse(_core.Transport, "IWARP", "transport") == _core.Transport.iWARP
    assert parse(_core.QpState, _core.QpState.ERR, "QP state") == _core.QpState.ERR


def test_parse_wrong_name_lists_the_allowed_ones():
    with pytest.raises(ValueError, match=r"unknown QP type 'XRC_TGT'; allowed: RC, UD, "
                                         r"XRC_SEND, XRC_RECV"):
        parse(_core.QpType, "XRC_TGT", "QP type")


def test_parse_wrong_type_is_a_type_error():
    with pytest.raises(TypeError, match="QP state must be a str or QpState, got int 3"):
        parse(_core.QpState, 3, "QP state")


def test_access_flags_forms():
    assert access_flags("LOCAL_WRITE|REMOTE_WRITE") == 0b11
    assert access_flags(["ACCESS_REMOTE_READ", "IBV_ACCESS_REMOTE_ATOMIC"]) == 0b1100
    assert access_flags(0b101) == 0b101
    with pytest.raises(ValueError, match="unknown access flag 'BOGUS'; allowed: LOCAL_WRITE"):
        access_flags("LOCAL_WRITE|BOGUS")
    with pytest.raises(ValueError, match="unknown bits 0x200"):
        access_flags(1 << 9)
    with pytest.raises(TypeError):
        access_flags(1.5)


def test_modify_mask_is_made_from_the_keywords_given():
    m = _core.QP_ATTR_MASK
    attr, mask = make_modify(dict(qp_state="INIT", pkey_index=0, port_num=1,
                                  qp_access_flags="LOCAL_WRITE"))
    assert mask == m["QP_STATE"] | m["QP_PKEY_INDEX"] | m["QP_PORT"] | m["QP_ACCESS_FLAGS"]
    assert attr.qp_state == _core.QpState.INIT and attr.qp_access_flags == 1
    attr, mask = make_modify(dict(qp_state="RTR", ah_attr={"dgid": "fe80::2", "dlid": 3},
                                  dest_qp_num=17), attr_mask="QP_PATH_MTU")
    assert mask == m["QP_STATE"] | m["QP_AV"] | m["QP_DEST_QPN"] | m["QP_PATH_MTU"]
    assert attr.ah_attr.dlid == 3 and attr.dest_qp_num == 17


def test_modify_rejects_unknown_keywords_and_bad_values():
    with pytest.raises(TypeError, match="unexpected keyword 'state'; allowed: qp_state"):
        make_modify(dict(state="INIT"))
    with pytest.raises(ValueError, match="unknown QP state 'READY'"):
        make_modify(dict(qp_state="READY"))
    with pytest.raises(TypeError, match="bad value 300 for timeout"):
        make_modify(dict(timeout=300))  # uint8
    with pytest.raises(TypeError, match="unknown ah_attr key 'gid'"):
        make_modify(dict(ah_attr={"gid": "::1"}))


def test_send_wr_from_keywords():
    wr = make_send_wr(7, "RDMA_WRITE", (0x1000, 64, 5), remote_addr=0x2000, rkey=9,
                      signaled=False)
    assert (wr.wr_id, wr.opcode, wr.remote_addr, wr.rkey, wr.signaled) == (
        7, _core.WrOpcode.RDMA_WRITE, 0x2000, 9, False)
    assert [(s.addr, s.length, s.lkey) for s in wr.sg_list] == [(0x1000, 64, 5)]
    with pytest.raises(TypeError, match=r"an sge is \(addr, length, lkey\)"):
        make_send_wr(1, "SEND", [(1, 2)])
    with pytest.raises(ValueError, match="unknown send opcode 'WRITE'"):
        make_send_wr(1, "WRITE")
    with pytest.raises(TypeError, match="post_send: bad value -1 for wr_id"):
        make_send_wr(-1)


def test_gid_parsing():
    assert str(parse_gid("fe80::1")) == "fe80:0000:0000:0000:0000:0000:0000:0001"
    assert parse_gid(bytes(range(16))).raw == bytes(range(16))
    with pytest.raises(ValueError, match="bad GID"):
        parse_gid("not-a-gid")


def test_time_units():
    assert (rdmalab.us(2), rdmalab.ms(3), rdmalab.sec(1)) == (2_000, 3_000_000, 1_000_000_000)
