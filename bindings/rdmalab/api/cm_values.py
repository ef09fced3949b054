"""rdma_cm's values: the events it reports (their names, CmEvent, a status's name, the IB REJ
reasons) and the arguments its calls take (CM timing, connection parameters, a port, the
endpoint spec the engine's connect and accept helpers read). rdmalab.api.cm's channels and
ids use them; they hold no state.
"""
from __future__ import annotations

import dataclasses
import errno as _errno
from typing import Any, NamedTuple, Optional

from .. import _core
from ..errors import Error, make_error
from ..names import allowed, parse
from .requests import make_qp_cap

CM_EVENTS = allowed(_core.CmEventType)
# Events that end a connection attempt: a wait for something else stops at them.
FAILURE_EVENTS = ("ADDR_ERROR", "ROUTE_ERROR", "CONNECT_ERROR", "UNREACHABLE", "REJECTED",
                  "DEVICE_REMOVAL")
FAILURE_TYPES = tuple(parse(_core.CmEventType, f, "CM event") for f in FAILURE_EVENTS)
REJ_REASON = dict(_core.CM_REJ_REASON)  # IB REJ reasons: "STALE_CONN": 10, ...
_REJ_NAME = {v: k for k, v in REJ_REASON.items()}
_PARAM_KEYS = ("responder_resources", "initiator_depth", "retry_count", "rnr_retry_count")
_QP_KEYS = ("max_send_wr", "max_recv_wr", "max_send_sge", "max_recv_sge", "max_inline_data")
DEFAULT_PORT = 7471


def status_name(event: str, status: int) -> str:
    """"OK" for 0, the errno name for a negative status ("ETIMEDOUT"), the IB REJ reason for a
    REJECTED ("STALE_CONN")."""
    if status == 0:
        return "OK"
    if status < 0:
        return _core.errno_name(-status)
    if event == "REJECTED" and status in _REJ_NAME:
        return _REJ_NAME[status]
    return str(status)


@dataclasses.dataclass(frozen=True)
class CmEvent:
    """An rdma_cm event: .event ("ESTABLISHED"), .status (0, -errno, or an IB REJ reason),
    .status_name, the id it is for (a new id on CONNECT_REQUEST), private data, the time the
    pump read it."""
    event: str
    status: int
    id: int
    listen_id: int
    private_data: bytes
    seq: int
    t_ns: int = 0
    raw: Any = dataclasses.field(default=None, repr=False, compare=False)

    @classmethod
    def from_core(cls, e, t_ns: int = 0) -> "CmEvent":
        return cls(e.event_name, e.status, e.id, e.listen_id, e.private_data, e.seq, t_ns, e)

    @property
    def status_name(self) -> str:
        return status_name(self.event, self.status)


class CmEventRecord(NamedTuple):
    """One entry of an id's event history."""
    name: str
    status: int
    t_ns: int


class CmEventError(Error):
    """A wait ended at an event that rules out the awaited one (REJECTED while waiting for
    ESTABLISHED). .event is that CmEvent."""
    event: CmEvent


def make_timing(timing=None, **kw) -> Optional[_core.CmTiming]:
    """A CmTiming from None, a CmTiming, a dict or keywords (cm_response_timeout,
    max_cm_retries, packet_life_time)."""
    if timing is None and not kw:
        return None
    if isinstance(timing, _core.CmTiming):
        if kw:
            raise TypeError("pass a CmTiming or keywords, not both")
        return timing
    values = dict(timing or {}, **kw)
    t = _core.CmTiming()
    for key, value in values.items():
        if not hasattr(t, key):
            raise TypeError(f"unknown CM timing {key!r}; allowed: cm_response_timeout, "
                            "max_cm_retries, packet_life_time")
        setattr(t, key, value)
    return t


def make_conn_param(private_data: bytes = b"", **kw) -> _core.ConnParam:
    p = _core.ConnParam()
    p.private_data = bytes(private_data)
    for key, value in kw.items():
        if key not in _PARAM_KEYS:
            raise TypeError(f"unknown connection parameter {key!r}; allowed: "
                            f"{', '.join(_PARAM_KEYS)}")
        setattr(p, key, value)
    return p


def check_port(verb: str, port) -> int:
    """The port, or the error the verb gives for it (TypeError, EINVAL out of range)."""
    if isinstance(port, bool) or not isinstance(port, int):
        raise TypeError(f"{verb}: port must be an int, got {type(port).__name__}")
    if not 0 <= port <= 0xFFFF:
        raise make_error(verb, _errno.EINVAL, f"port {port} out of range 0..65535")
    return port


def _split(kw: dict) -> tuple[dict, dict]:
    """Keyword arguments into (QP capabilities, connection parameters)."""
    qp = {k: kw.pop(k) for k in list(kw) if k in _QP_KEYS}
    param = {k: kw.pop(k) for k in list(kw) if k in _PARAM_KEYS}
    if kw:
        raise TypeError(f"unknown argument(s) {sorted(kw)}; allowed: "
                        f"{', '.join(_QP_KEYS + _PARAM_KEYS)}, cqe")
    return qp, param


def endpoint_spec(dst: str = "", port: int = 0, *, timing=None, private_data: bytes = b"",
                  cqe: int = 64, resolve_timeout_ns: Optional[int] = None,
                  **kw) -> _core.CmEndpointSpec:
    """What the engine's connect and accept helpers (_core.cm_connect, cm_accept) take: kw are
    QP capabilities and connection parameters."""
    qp, param = _split(kw)
    s = _core.CmEndpointSpec()
    s.dst, s.port, s.cqe = dst, port, cqe
    s.cap = make_qp_cap(**qp)
    s.param = make_conn_param(private_data, **param)
    s.timing = make_timing(timing)
    if resolve_timeout_ns is not None:
        s.resolve_timeout_ns = resolve_timeout_ns
    return s
