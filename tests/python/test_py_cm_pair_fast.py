"""CmPair's one-call path on a model lab (resources.CmPair._up_at_once, _down_at_once,
_close_channel) against its step-by-step path: the same history byte for byte, the same
objects, and the same errors where a step fails."""

import pytest

import rdmalab
from rdmalab.api import cm
from rdmalab import ms
from rdmalab.errors import Hung
from rdmalab.api.resources import CmPair, CmSide


@pytest.fixture
def step_by_step(monkeypatch):
    """Makes CmPair take the step-by-step path (what every non-model lab does)."""
    def slow(enabled: bool):
        if enabled:
            monkeypatch.setattr(CmPair, "_up_at_once", lambda self, *a: False)
            monkeypatch.setattr(CmPair, "_down_at_once", lambda self, *a: False)
            monkeypatch.setattr("rdmalab.api.resources._close_channel",
                                lambda ch, timeout_ns: ch.close(timeout_ns))
        else:
            monkeypatch.undo()
    return slow


def cycles(personality: str, n: int = 12) -> tuple[str, list]:
    """n pairs (some with private data, some closed while connected); the history and what
    each pair's objects were."""
    lab = rdmalab.model_lab(seed=11, hosts=("a", "b"), personality=personality)
    server, client = lab.host("b").process("s"), lab.host("a").process("c")
    seen = []
    for i in range(n):
        pair = CmPair(lab, process_server=server, process_client=client, port=300 + i,
                      private_data=b"hi" if i % 3 == 0 else b"")
        c, s = pair.client, pair.server
        seen.append((c.conn.role, s.conn.role, pair.listener.role, s.conn.request.event,
                     s.conn.request.t_ns, c.qp.qp_num, s.qp.qp_num, c.qp.state,
                     c.mr.length, type(c) is CmSide, c.ctx is c.conn.ctx, c.pd is c.conn.pd))
        if i % 2:
            pair.disconnect()
        pair.close()
        seen.append((pair.client_channel._closed, pair.server_channel._closed,
                     c.conn.destroyed, s.conn.destroyed, pair.listener.destroyed,
                     [e.name for e in c.conn.events]))
    text = lab._o.history_jsonl()
    lab.shutdown()
    return text, seen


@pytest.mark.parametrize("personality", ["roce", "ib", "iwarp-siw"])
def test_one_call_path_gives_the_same_history_and_objects(personality, step_by_step):
    fast = cycles(personality)
    step_by_step(True)
    slow = cycles(personality)
    assert fast[1] == slow[1]
    assert fast[0] == slow[0]
    assert '"kind":"cm_event_dispatched"' in fast[0]


def failing_pair(drop: str):
    lab = rdmalab.model_lab(seed=3, hosts=("a", "b"), personality="ib")
    try:
        if drop != "DREQ":
            lab.faults.drop(cm=drop)
        pair = CmPair(lab, timeout_ns=ms(50))
        lab.faults.drop(cm=drop)
        pair.disconnect(ms(20))
    except Hung as e:
        return str(e), lab._o.history_size(), lab.now_ns
    finally:
        lab.shutdown()
    raise AssertionError(f"dropping every {drop} did not hang the pair")


@pytest.mark.parametrize("drop, stuck", [
    ("REQ", "listener cm_id:3 on b stuck in LISTEN/LISTEN waiting for CONNECT_REQUEST"),
    ("REP", "active side cm_id:5 on a stuck in CONNECT/REQ_SENT waiting for ESTABLISHED"),
    ("DREQ", "passive side cm_id:10 on b stuck in CONNECT/ESTABLISHED waiting for DISCONNECTED"),
])
def test_a_step_that_fails_raises_what_the_step_by_step_path_raises(drop, stuck, step_by_step):
    fast = failing_pair(drop)
    step_by_step(True)
    slow = failing_pair(drop)
    assert fast == slow
    assert stuck in fast[0]


def test_close_with_a_request_nobody_took_wraps_it_as_the_channel_does():
    lab = rdmalab.model_lab(seed=5, hosts=("a", "b", "c"), personality="roce")
    pair = CmPair(lab)
    extra = lab.host("c").process("x").event_channel().connect("b", cm.DEFAULT_PORT)
    lab.run_for(ms(1))  # its CONNECT_REQUEST reaches the listener; nobody takes it
    pair.close()
    ids = pair.server_channel.ids
    assert [i.role for i in ids] == ["listener", "passive side", "passive side"]
    assert all(i.destroyed for i in ids)
    assert extra.channel.running
    lab.shutdown()
