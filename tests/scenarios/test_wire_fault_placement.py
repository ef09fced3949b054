"""A wire fault applied in the fault switch and the same fault as an nftables rule in the
sending guest give the same outcome: software providers (rxe, siw) send through the host's
network stack, so on any machine with such a provider the rule can live in the host itself
(where no switch of ours is on the wire). Hardware RoCE bypasses the host's stack: there only
a box on the path can apply it."""

import pytest

from rdmalab import WIRE_PLACEMENT, FaultNotSupported, ms, sec
from rdmalab.api.resources import RCPair

N = 16


def cut_and_send(lab, at: str, **pair_kw):
    """a's packets are all dropped (rule at `at`), then N SENDs are posted and a drained;
    returns (drain report, packets the rule dropped)."""
    pair = RCPair(lab, max_send_wr=N + 1, max_recv_wr=N + 1, cqe=4 * N, **pair_kw)
    pair.b.post_recv(length=64, count=N)
    pair.a.post_send(length=64)
    assert pair.a.wait_completions(1, timeout_ns=sec(2)), "the connection does not carry data"
    rule = lab.faults.drop(src_host="a", at=at)
    pair.a.post_send(length=64, count=N)
    lab.run_for(ms(50))
    report = pair.a.drain(timeout_ns=sec(2))
    hits = rule.hits
    rule.remove()
    return report, hits


def test_same_drop_in_the_switch_and_in_the_host(lab):
    if not lab.has(WIRE_PLACEMENT):
        pytest.skip(f"{lab.description} has no {WIRE_PLACEMENT}: one fabric, where a rule sits "
                    "changes nothing")
    try:
        in_switch, switch_hits = cut_and_send(lab, "switch")
        # a second connection (on iWARP a second rdma_cm listener: another port)
        second = {"port": 7472} if lab.host("a").caps().transport == "iWARP" else {}
        in_host, host_hits = cut_and_send(lab, "host", **second)
    except FaultNotSupported as e:
        pytest.skip(f"needs both placements: {e}")
    assert switch_hits > 0 and host_hits > 0
    assert in_switch.complete and in_host.complete, (in_switch.detail, in_host.detail)
    outcome = lambda r: (r.outstanding_sq, r.succeeded, r.flushed, r.errored)  # noqa: E731
    assert outcome(in_switch) == outcome(in_host), \
        f"switch {outcome(in_switch)} vs host {outcome(in_host)} (outstanding, ok, flushed, err)"
