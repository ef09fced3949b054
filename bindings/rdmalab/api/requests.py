"""Requests built from keywords: QpAttr and its mask for ibv_modify_qp, send and receive
work requests, address vectors, QP caps and SRQ attributes. Wrong keywords raise TypeError
naming the allowed ones; wrong values raise ValueError or TypeError naming the field."""

from __future__ import annotations

from .. import _core
from ..names import access_flags, parse, parse_flags, parse_gid


def _sge_list(sge) -> list:
    if sge is None:
        return []
    if isinstance(sge, (_core.Sge, tuple)):
        sge = [sge]
    out = []
    for s in sge:
        if isinstance(s, _core.Sge):
            out.append(s)
        elif isinstance(s, tuple) and len(s) == 3:
            out.append(_core.Sge(*s))
        else:
            raise TypeError(f"an sge is (addr, length, lkey) or Sge, got {s!r}")
    return out


def _set(obj, field: str, value, what: str) -> None:
    try:
        setattr(obj, field, value)
    except TypeError:
        raise TypeError(f"{what}: bad value {value!r} for {field} "
                        f"(wrong type or out of range)") from None


# Qp.modify keywords -> (attribute mask bit, QpAttr field, converter).
_MODIFY = {
    "qp_state": ("QP_STATE", lambda v: parse(_core.QpState, v, "QP state")),
    "cur_qp_state": ("QP_CUR_STATE", lambda v: parse(_core.QpState, v, "QP state")),
    "en_sqd_async_notify": ("QP_EN_SQD_ASYNC_NOTIFY", bool),
    "qp_access_flags": ("QP_ACCESS_FLAGS", access_flags),
    "pkey_index": ("QP_PKEY_INDEX", None),
    "port_num": ("QP_PORT", None),
    "qkey": ("QP_QKEY", None),
    "ah_attr": ("QP_AV", lambda v: make_ah(v)),
    "path_mtu": ("QP_PATH_MTU", None),
    "timeout": ("QP_TIMEOUT", None),
    "retry_cnt": ("QP_RETRY_CNT", None),
    "rnr_retry": ("QP_RNR_RETRY", None),
    "rq_psn": ("QP_RQ_PSN", None),
    "max_rd_atomic": ("QP_MAX_QP_RD_ATOMIC", None),
    "min_rnr_timer": ("QP_MIN_RNR_TIMER", None),
    "sq_psn": ("QP_SQ_PSN", None),
    "max_dest_rd_atomic": ("QP_MAX_DEST_RD_ATOMIC", None),
    "dest_qp_num": ("QP_DEST_QPN", None),
    "cap": ("QP_CAP", lambda v: make_qp_cap(**v) if isinstance(v, dict) else v),
}
MODIFY_KEYWORDS = tuple(_MODIFY)


def make_ah(value) -> _core.AhAttr:
    """An AhAttr from an AhAttr or a dict {dgid, dlid, sgid_index, port_num, sl}."""
    if isinstance(value, _core.AhAttr):
        return value
    if not isinstance(value, dict):
        raise TypeError(f"ah_attr must be a dict or AhAttr, got {type(value).__name__}")
    ah = _core.AhAttr()
    for key, v in value.items():
        if key == "dgid":
            v = parse_gid(v)
        elif key not in ("dlid", "sgid_index", "port_num", "sl"):
            raise TypeError(f"unknown ah_attr key {key!r}; allowed: dgid, dlid, sgid_index, "
                            "port_num, sl")
        _set(ah, key, v, "ah_attr")
    return ah


def make_qp_cap(**kw) -> _core.QpCap:
    cap = _core.QpCap()
    for key, v in kw.items():
        if not hasattr(cap, key):
            raise TypeError(f"unknown QP cap {key!r}; allowed: max_send_wr, max_recv_wr, "
                            "max_send_sge, max_recv_sge, max_inline_data")
        _set(cap, key, v, "cap")
    return cap


def make_modify(kw: dict, attr_mask=None) -> tuple[_core.QpAttr, int]:
    """QpAttr and mask from modify keywords: the mask holds exactly the keywords given (plus
    attr_mask, names or bits, to name a bit without setting its field)."""
    attr, mask = _core.QpAttr(), 0
    for key, value in kw.items():
        if key not in _MODIFY:
            raise TypeError(f"modify() got an unexpected keyword {key!r}; "
                            f"allowed: {', '.join(_MODIFY)}")
        bit, conv = _MODIFY[key]
        _set(attr, key, conv(value) if conv else value, "modify")
        mask |= _core.QP_ATTR_MASK[bit]
    if attr_mask is not None:
        mask |= parse_flags(_core.QP_ATTR_MASK, attr_mask, "QP attribute mask")
    return attr, mask


def make_send_wr(wr_id=0, opcode="SEND", sge=None, signaled=True, imm_data=0, remote_addr=0,
                 rkey=0, remote_qpn=0, remote_qkey=0, ah=None, remote_srqn=0) -> _core.SendWr:
    wr = _core.SendWr()
    wr.opcode = parse(_core.WrOpcode, opcode, "send opcode")
    wr.sg_list = _sge_list(sge)
    wr.ah = None if ah is None else make_ah(ah)
    for key, v in (("wr_id", wr_id), ("signaled", signaled), ("imm_data", imm_data),
                   ("remote_addr", remote_addr), ("rkey", rkey), ("remote_qpn", remote_qpn),
                   ("remote_qkey", remote_qkey), ("remote_srqn", remote_srqn)):
        _set(wr, key, v, "post_send")
    return wr


def make_recv_wr(wr_id=0, sge=None) -> _core.RecvWr:
    wr = _core.RecvWr()
    _set(wr, "wr_id", wr_id, "post_recv")
    wr.sg_list = _sge_list(sge)
    return wr


def srq_attr(max_wr: int, max_sge: int, srq_limit: int) -> _core.SrqInitAttr:
    attr = _core.SrqInitAttr()
    for key, v in (("max_wr", max_wr), ("max_sge", max_sge), ("srq_limit", srq_limit)):
        _set(attr, key, v, "create_srq")
    return attr
