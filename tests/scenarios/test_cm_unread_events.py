"""rdma_destroy_id with CM events the application has not finished with (semantics.md A/F).

What librdmacm and ucma do (rdma-core librdmacm/cma.c, Linux drivers/infiniband/core/ucma.c):
rdma_destroy_id() writes RDMA_USER_CM_CMD_DESTROY_ID; the kernel's ucma_destroy_id ->
ucma_destroy_private_ctx -> ucma_cleanup_ctx_events frees the events still queued for the id
(never read) and answers events_reported, the number the application did read. rdma_destroy_id
then waits on the id's condition variable `while (id_priv->events_completed < ret)`;
events_completed grows only in rdma_ack_cm_event (ucma_complete_event). So an unread event is
discarded and costs nothing, and an event read but not acked blocks rdma_destroy_id until it is
acked (rdmalab raises EBUSY at the deadline where librdmacm would block forever).

The pump normally reads and acks everything; ch.pause_reading() and ch.hold_acks(id) leave
events unread or unacked."""

import errno

import pytest

from rdmalab import Error, ms
from rdmalab.api.cm_timing import WAIT_PAST_BOUND_NS, late_span_bound_ns, stood_still
from rdmalab.api.resources import CmPair


def names(conn):
    return [e.name for e in conn.events]


def destroy_id_span(lab, host="b"):
    """(start, end) on the lab's clock of the last rdma_destroy_id on host, as its own stack
    recorded it (cm_destroy_begin, then cm_destroy_end or cm_destroy_failed): the destroy's
    time, not the harness's calls into the host's agent around it (the MR, QP, CQ and PD
    that close() also releases: on a loaded TCG guest each call took up to 500 ms)."""
    history = lab.history()
    t0 = lab.t0_ns  # an agent lab's history counts from its start
    begin = [r for r in history if r["kind"] == "cm_destroy_begin" and r["host"] == host][-1]
    end = next(r for r in history if r["seq"] > begin["seq"] and r["host"] == host
               and r["object"] == begin["object"]
               and r["kind"] in ("cm_destroy_end", "cm_destroy_failed"))
    return t0 + begin["t_ns"], t0 + end["t_ns"]


def test_destroy_id_discards_an_unread_event(lab):
    """The server's DISCONNECTED stays unread in its channel: rdma_destroy_id returns at
    once (events_reported is 0, nothing to wait for) and the event is gone: reading the
    channel again never yields it."""
    pair = CmPair(lab)
    server, ch = pair.server.conn, pair.server_channel
    ch.pause_reading()
    pair.client.conn.disconnect()
    lab.run_for(ms(100) + lab.tolerance_ns)  # the peer's close reached b; nobody reads it
    assert "DISCONNECTED" not in names(server)
    pair.server.close(timeout_ns=ms(500))  # MR, QP, CQ, rdma_destroy_id, PD
    assert server.destroyed
    # No wait for an ack: at once on the model; on a device + tolerance and the time b stood
    # still.
    t0, t1 = destroy_id_span(lab)
    bound = late_span_bound_ns(lab, "b", t0, t1, 0)
    assert t1 - t0 <= bound, \
        f"rdma_destroy_id took {(t1 - t0) / 1e6:.1f} ms; at most {bound / 1e6:.1f} ms with no " \
        f"wait for an ack (tolerance + stall: {stood_still(lab, 'b', t0, t1)})"
    ch.resume_reading()
    lab.run_for(ms(100))
    assert "DISCONNECTED" not in names(server)  # discarded with the id, never read


def test_destroy_id_waits_for_the_ack_of_a_read_event(lab):
    """The server's DISCONNECTED is read and not acked: rdma_destroy_id waits for the ack
    (EBUSY at the deadline here) and the id stays; once acked, destroy goes through."""
    pair = CmPair(lab)
    server, ch = pair.server.conn, pair.server_channel
    ch.hold_acks(server)
    t_dreq = lab.now_ns
    pair.client.conn.disconnect()
    ev = server.wait("DISCONNECTED", ms(100) + WAIT_PAST_BOUND_NS)  # read by the pump, not acked
    bound = late_span_bound_ns(lab, ("a", "b"), t_dreq, ev.t_ns, ms(100))
    assert ev.t_ns - t_dreq <= bound, \
        f"DISCONNECTED {(ev.t_ns - t_dreq) / 1e6:.1f} ms after a's rdma_disconnect; at most " \
        f"{bound / 1e6:.1f} ms (tolerance + stall: {stood_still(lab, ('a', 'b'), t_dreq, ev.t_ns)})"
    assert ch.held_acks(server) == 1
    called = lab.now_ns
    with pytest.raises(Error) as info:
        pair.server.close(timeout_ns=ms(50))
    assert (info.value.verb, info.value.errno) == ("rdma_destroy_id", errno.EBUSY)
    assert lab.now_ns - called >= ms(50), "EBUSY before the deadline"
    # EBUSY at the 50 ms deadline (set as close() began: rdma_destroy_id begins a little
    # after): exactly on the model; on a device + tolerance and the time b stood still.
    t0, t1 = destroy_id_span(lab)
    bound = late_span_bound_ns(lab, "b", t0, t1, ms(50))
    assert t1 - t0 <= bound, \
        f"rdma_destroy_id failed (EBUSY) {(t1 - t0) / 1e6:.1f} ms after it began with a 50 ms " \
        f"deadline; at most {bound / 1e6:.1f} ms (tolerance + stall: " \
        f"{stood_still(lab, 'b', t0, t1)})"
    assert not server.destroyed
    assert ch.release_acks(server) == 1
    pair.server.close(timeout_ns=ms(50))
    assert server.destroyed
