"""An iWARP peer whose FIN is lost (issue 5; seed 001, semantics.md F).

rdma_disconnect on iWARP is iw_cm_disconnect(id, 0): the QP goes to CLOSING (SQD) and the
provider closes its TCP half with a FIN. Every FIN from the closer is lost here. What follows
is the provider's (caps.iw_close_timeout_s):

- cxgb4 (60 s, ep_timeout_secs): the endpoint waits for the peer's FIN and the ACK of its own;
  its timer fires after 60 s (process_timeout): the QP to ERROR, DISCONNECTED(-ETIMEDOUT) at
  the closer, then an abort (RST) which the peer gets as DISCONNECTED(-ECONNRESET).
- siw (0): siw_qp_cm_drop reports the close at once, DISCONNECTED(0), and releases the socket;
  TCP retransmits the orphaned FIN on its own. The peer stays half-open and hears nothing
  while it is idle. (On the VM lab the peer learnt of the close when it sent: the orphaned
  socket answered RST and the peer got DISCONNECTED; the model does not carry that.)
"""

import pytest

from rdmalab import ms, sec
from rdmalab.api.cm_timing import WAIT_PAST_BOUND_NS, late_span_bound_ns, stood_still
from rdmalab.api.resources import CmPair

PEER_IDLE_BOUND_NS = sec(5)   # siw: how long the idle peer is watched for a close it never hears


def names(conn):
    return [e.name for e in conn.events]


def lose_every_fin(lab):
    fins = lab.faults.watch(tcp_flags="FIN", src_host="a")
    lab.faults.drop(tcp_flags="FIN", src_host="a")
    return fins


@pytest.mark.requires(transport="iWARP")
@pytest.mark.finding("siw-close-does-not-wait-for-the-fin")
def test_close_with_every_fin_lost(lab):
    timeout_ns = sec(lab.host("a").caps().iw_close_timeout_s)
    pair = CmPair(lab)
    client, server = pair.client.conn, pair.server.conn
    fins = lose_every_fin(lab)
    t0 = lab.now_ns
    client.disconnect()
    if timeout_ns == 0:   # siw: the close is reported at once
        mine = client.wait("DISCONNECTED", ms(100) + WAIT_PAST_BOUND_NS)
        assert mine.status == 0, f"DISCONNECTED({mine.status_name})"
        bound = late_span_bound_ns(lab, "a", t0, mine.t_ns, ms(100))
        assert mine.t_ns - t0 <= bound, \
            f"the closer saw DISCONNECTED {(mine.t_ns - t0) / 1e6:.1f} ms after " \
            f"rdma_disconnect, not at once: at most {bound / 1e6:.1f} ms (100 ms + tolerance " \
            f"+ stall: {stood_still(lab, 'a', t0, mine.t_ns)})"
        assert fins.hits >= 1, "no FIN left the closer: the fault was not exercised"
        lab.sleep(PEER_IDLE_BOUND_NS)
        assert names(server) == ["CONNECT_REQUEST", "ESTABLISHED"], \
            f"the idle peer heard of a close whose FINs were all lost: {names(server)}"
        pair.close()
        return
    bound = timeout_ns + sec(5) + lab.tolerance_ns
    mine = client.wait("DISCONNECTED", bound)
    assert fins.hits >= 1, "no FIN left the closer: the fault was not exercised"
    assert mine.t_ns - t0 >= timeout_ns - ms(10), \
        f"the closer saw DISCONNECTED({mine.status_name}) {(mine.t_ns - t0) / 1e6:.0f} ms " \
        "after rdma_disconnect although its FIN was never acknowledged"
    assert mine.status_name == "ETIMEDOUT"      # process_timeout: close_complete_upcall
    peer = server.wait("DISCONNECTED", sec(1) + lab.tolerance_ns)
    assert peer.status_name == "ECONNRESET"     # the abort that follows: peer_abort
    assert names(server) == ["CONNECT_REQUEST", "ESTABLISHED", "DISCONNECTED"]
    pair.close()
