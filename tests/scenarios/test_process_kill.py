"""A process that owns a connection dies by SIGKILL (issue 5; seed 003's "the creator dies
first", here for a plain RC connection, which every device has).

The kernel releases everything a dying process owned when its files close: uverbs destroys
its QPs, CQs, MRs, PDs and contexts; ucma destroys its rdma_cm ids without waiting for acks.
What the peer then sees is the CM's destroy path (semantics.md B, F):
- IB/RoCE: cm_destroy_id on an ESTABLISHED id sends one DREQ and goes to TIMEWAIT without
  retrying it: the peer gets DISCONNECTED(0) at once; its own rdma_disconnect answers with a
  DREP and its id leaves through TIMEWAIT_EXIT.
- iWARP: destroy_cm_id on ESTABLISHED moves the QP to ERR (abrupt) and the driver closes the
  TCP connection: the peer gets DISCONNECTED (only CLOSE reaches rdma_cm users).
On a device the process is an OS process of its own (lab.killable_process) and the kernel's
own account (`rdma res show`) must drop to nothing for its pid.
"""

import pytest

from rdmalab import Error, ms, sec
from rdmalab.api.cm_timing import (WAIT_PAST_BOUND_NS, IbCmTiming, late_bound_ns,
                                   late_span_bound_ns, stood_still)
from rdmalab.api.resources import CmPair


def names(conn):
    return [e.name for e in conn.events]


def is_iwarp(lab):
    return lab.host("a").caps().transport == "iWARP"


def test_killed_process_releases_its_connection(lab):
    iwarp = is_iwarp(lab)
    victim = lab.killable_process("a", "victim")
    dreqs = None if iwarp else lab.faults.watch(cm="DREQ", src_host="a")
    pair = CmPair(lab, process_client=victim)
    client, server = pair.client.conn, pair.server.conn
    pair.server.post_recv(length=64)
    pair.client.post_send(length=64)
    assert pair.server.wait_completions(1) and pair.client.wait_completions(1), \
        "the connection does not carry data"
    for i in range(4):                    # work the survivor still has posted at the kill
        pair.server.post_recv(length=64, wr_id=100 + i)
    before = victim.kernel_objects()
    assert before, "the victim holds nothing before the kill: the check below could not fail"

    victim.kill()  # returns once every thread of it has exited: its files are closed
    # "At once" counts from there: how long the kernel takes to tear down a dying process's
    # memory (exit_mm runs before exit_files) is no CM rule, and in a TCG guest on a busy
    # machine a Python agent's took over 600 ms.
    t0 = lab.now_ns
    assert not victim.alive
    with pytest.raises(Error) as e:
        victim.open_device()
    assert e.value.errno_name == "ESRCH"

    ev = server.wait("DISCONNECTED", ms(100) + WAIT_PAST_BOUND_NS)  # bound asserted next
    bound = late_span_bound_ns(lab, ("a", "b"), t0, ev.t_ns, ms(100))
    assert ev.t_ns - t0 < bound, \
        f"DISCONNECTED at b {(ev.t_ns - t0) / 1e6:.1f} ms after the kill; under " \
        f"{bound / 1e6:.1f} ms (100 ms + tolerance + stall: " \
        f"{stood_still(lab, ('a', 'b'), t0, ev.t_ns)})"
    lab.wait_until(lambda: not victim.kernel_objects(), sec(5) + lab.tolerance_ns,
                   f"the kernel to release what pid {victim.pid} held ({before})")

    server.disconnect()
    if iwarp:
        assert names(server) == ["CONNECT_REQUEST", "ESTABLISHED", "DISCONNECTED"]
    else:
        assert ev.status == 0
        timing = IbCmTiming.for_caps(lab.host("b").caps())
        w0 = lab.now_ns
        tw = server.wait("TIMEWAIT_EXIT", timing.timewait_ns + sec(10))  # bound asserted next
        bound = late_bound_ns(lab, "b", w0, tw.t_ns, timing.timewait_ns + ms(10))
        assert tw.t_ns - w0 <= bound, \
            f"TIMEWAIT_EXIT {(tw.t_ns - w0) / 1e6:.1f} ms after b's rdma_disconnect; at most " \
            f"{bound / 1e6:.1f} ms (the wheel's TIMEWAIT + slack + stall: " \
            f"{stood_still(lab, 'b', w0, tw.t_ns)})"
        assert names(server) == ["CONNECT_REQUEST", "ESTABLISHED", "DISCONNECTED",
                                 "TIMEWAIT_EXIT"]
        assert dreqs.hits == 1, f"{dreqs.hits} DREQs from the killed side (cm_destroy_id " \
                                "sends one and does not retry it)"
    # The survivor's receives end exactly once: flushed by its own disconnect.
    report = pair.server.drain(sec(1) + lab.tolerance_ns)
    assert report.complete, f"drain did not finish: {report.detail}"
    assert report.outstanding_rq == 4 and report.flushed >= 4, report.detail
    ledger = pair.server.traffic.check()
    assert not ledger.violations and ledger.unknown == 0, ledger.violations
    assert ledger.succeeded + ledger.flushed + ledger.errored + ledger.implied == ledger.posted
    pair.server.close()
