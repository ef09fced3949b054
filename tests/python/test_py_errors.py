"""Errors carry the verb and errno; parked callback errors come back to the scenario."""

import errno

import pytest

import rdmalab
from rdmalab import _core
from rdmalab.errors import raise_parked
from rdmalab.faults import NoFaults


def test_engine_error_becomes_rdmalab_error():
    with pytest.raises(rdmalab.Error) as info:
        _core.raise_error("ibv_post_send", errno.EBADF, "qp 3 was destroyed")
    e = info.value
    assert str(e) == "ibv_post_send: EBADF (9): qp 3 was destroyed"
    assert (e.verb, e.errno, e.errno_name, e.detail) == (
        "ibv_post_send", 9, "EBADF", "qp 3 was destroyed")
    assert isinstance(e, RuntimeError)
    assert not isinstance(e, rdmalab.DeadlineExceeded)


def test_deadline_exceeded_is_an_error_with_etimedout():
    with pytest.raises(rdmalab.DeadlineExceeded) as info:
        _core.raise_error("AsyncDispatcher::stop", 0, "a handler is still running", deadline=True)
    assert isinstance(info.value, rdmalab.Error)
    assert info.value.errno == errno.ETIMEDOUT
    assert str(info.value) == "AsyncDispatcher::stop: ETIMEDOUT (110): a handler is still running"


def test_python_made_errors_use_the_engine_format():
    e = rdmalab.make_error("ibv_destroy_qp", errno.EBUSY, "1 event not acked")
    assert isinstance(e, rdmalab.Error)
    assert str(e) == "ibv_destroy_qp: EBUSY (16): 1 event not acked"
    assert e.errno_name == "EBUSY"


def test_fault_not_supported_names_the_fault():
    class FakeLab:
        backend, description = "verbs", "verbs:local"

    with pytest.raises(rdmalab.FaultNotSupported) as info:
        NoFaults(FakeLab()).port_down("a")
    e = info.value
    assert isinstance(e, rdmalab.Error)
    assert (e.fault, e.errno) == ("port_down", errno.EOPNOTSUPP)
    assert str(e) == "port_down: EOPNOTSUPP (95): verbs:local cannot apply this fault"


def test_hung_is_a_deadline_exceeded():
    h = rdmalab.Hung("QP in RTS", "Hung: waited ...")
    assert isinstance(h, rdmalab.DeadlineExceeded) and isinstance(h, rdmalab.Error)
    assert (h.verb, h.errno, h.what, str(h)) == ("wait_until", errno.ETIMEDOUT, "QP in RTS",
                                                 "Hung: waited ...")


def test_nothing_parked_raises_nothing():
    assert _core.pending_python_errors() == 0
    raise_parked()
