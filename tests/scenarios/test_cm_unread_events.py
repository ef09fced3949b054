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
from rdmalab.resources import CmPair


def names(conn):
    return [e.name for e in conn.events]


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
    t0 = lab.now_ns
    pair.server.close(timeout_ns=ms(500))  # MR, QP, CQ, rdma_destroy_id, PD
    assert server.destroyed
    assert lab.now_ns - t0 <= lab.tolerance_ns  # no wait for an ack
    ch.resume_reading()
    lab.run_for(ms(100))
    assert "DISCONNECTED" not in names(server)  # discarded with the id, never read


def test_destroy_id_waits_for_the_ack_of_a_read_event(lab):
    """The server's DISCONNECTED is read and not acked: rdma_destroy_id waits for the ack
    (EBUSY at the deadline here) and the id stays; once acked, destroy goes through."""
    pair = CmPair(lab)
    server, ch = pair.server.conn, pair.server_channel
    ch.hold_acks(server)
    pair.client.conn.disconnect()
    server.wait("DISCONNECTED", ms(100) + lab.tolerance_ns)  # read by the pump, not acked
    assert ch.held_acks(server) == 1
    t0 = lab.now_ns
    with pytest.raises(Error) as info:
        pair.server.close(timeout_ns=ms(50))
    assert (info.value.verb, info.value.errno) == ("rdma_destroy_id", errno.EBUSY)
    assert ms(50) <= lab.now_ns - t0 <= ms(50) + lab.tolerance_ns
    assert not server.destroyed
    assert ch.release_acks(server) == 1
    pair.server.close(timeout_ns=ms(50))
    assert server.destroyed
