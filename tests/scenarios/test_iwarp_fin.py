"""An iWARP peer whose FIN is lost (issue 5; seed 001, semantics.md F).

rdma_disconnect on iWARP is iw_cm_disconnect(id, 0): the QP goes to CLOSING (SQD) and the
provider closes its TCP half with a FIN. When every FIN from the closer is lost, the close
cannot finish. The model's iWARP providers follow cxgb4: the endpoint waits for the close to
complete, gives up after its 60 s timer (ep_timeout_secs) with an abort, and both sides get
DISCONNECTED(-ECONNRESET) from the RST. A provider that instead reports the close at once
and leaves TCP to retransmit the FIN leaves the peer half-open: the peer learns of the close
only when it sends.
"""

import pytest

from rdmalab import ms, sec
from rdmalab.resources import CmPair

IW_CLOSE_TIMEOUT_NS = sec(60)   # cxgb4 ep_timeout_secs; the model's kIwTimeoutNs


def names(conn):
    return [e.name for e in conn.events]


def lose_every_fin(lab, pair):
    fins = lab.faults.watch(tcp_flags="FIN", src_host="a")
    lab.faults.drop(tcp_flags="FIN", src_host="a")
    return fins


@pytest.mark.requires(transport="iWARP")
@pytest.mark.finding("siw-close-does-not-wait-for-the-fin")
def test_lost_fin_ends_in_an_abort_on_both_sides(lab):
    pair = CmPair(lab)
    client, server = pair.client.conn, pair.server.conn
    fins = lose_every_fin(lab, pair)
    t0 = lab.now_ns
    client.disconnect()
    bound = IW_CLOSE_TIMEOUT_NS + sec(5) + lab.tolerance_ns
    mine = client.wait("DISCONNECTED", bound)
    assert fins.hits >= 1, "no FIN left the closer: the fault was not exercised"
    assert mine.t_ns - t0 >= IW_CLOSE_TIMEOUT_NS - ms(10), \
        f"the closer saw DISCONNECTED({mine.status}) {(mine.t_ns - t0) / 1e6:.0f} ms after " \
        "rdma_disconnect although its FIN was never acknowledged"
    peer = server.wait("DISCONNECTED", sec(1) + lab.tolerance_ns)
    assert mine.status_name == "ECONNRESET" and peer.status_name == "ECONNRESET"
    assert names(server) == ["CONNECT_REQUEST", "ESTABLISHED", "DISCONNECTED"]
    pair.close()
