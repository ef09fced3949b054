"""The model's planted defects (rdmalab.labs.engine.MUTATIONS), as the swarm's mutation test switches
them on: model_lab(mutations=...) refuses unknown names, the history says a lab is mutated,
and for each defect a small Python-driven scenario comes out differently on the mutated model
than on the clean one (so a swarm workload can reach it)."""

import pathlib

import pytest

import rdmalab
from rdmalab import Error, Hung, ms, sec
from rdmalab.labs.engine import MUTATIONS
from rdmalab.api.resources import CmPair, Player
from rdmalab.api.stack import Dispatcher


def lab_with(mutation, on, personality="ib"):
    return rdmalab.model_lab(personality=personality, mutations=(mutation,) if on else ())


def test_known_mutations_are_the_five_planted_defects():
    assert list(MUTATIONS) == ["lost_flush_completion", "handler_after_destroy",
                               "missing_disconnected", "double_timewait_exit",
                               "destroy_ignores_unacked"]
    assert all(MUTATIONS.values())  # each says what it breaks


def test_each_mutation_has_exactly_one_marked_site():
    core = pathlib.Path(__file__).resolve().parents[2] / "core"
    text = [p.read_text() for p in core.rglob("*") if p.suffix in (".cc", ".h")]
    for name in MUTATIONS:
        assert sum(t.count(f"// MUTATION({name}):") for t in text) == 1, name


def test_unknown_mutation_is_refused_with_the_known_names():
    with pytest.raises(ValueError) as err:
        rdmalab.model_lab(mutations=("lost_flush_completion", "no_such_bug"))
    assert "'no_such_bug'" in str(err.value)
    for name in MUTATIONS:
        assert name in str(err.value)


def test_a_single_name_must_come_in_a_list():
    with pytest.raises(TypeError):
        rdmalab.model_lab(mutations="lost_flush_completion")


def test_the_engine_refuses_unknown_names_too():
    opts = rdmalab._core.LabOptions()
    host = rdmalab._core.HostSpec()
    host.name = "a"
    opts.hosts = [host]
    opts.mutations = ["no_such_bug"]
    with pytest.raises(Error) as err:
        rdmalab._core.make_lab(opts)
    assert "no_such_bug" in str(err.value) and "double_timewait_exit" in str(err.value)


def test_lab_start_says_the_lab_is_mutated():
    with rdmalab.model_lab() as clean, lab_with("double_timewait_exit", True) as bad:
        assert clean.mutations == ()
        assert "mutations" not in clean.history()[0]["data"]
        assert bad.mutations == ("double_timewait_exit",)
        start = bad.history()[0]
        assert start["kind"] == "lab_start"
        assert start["data"]["mutations"] == ["double_timewait_exit"]


# -- each defect, reached from Python --------------------------------------------------------

@pytest.mark.parametrize("on", [False, True])
def test_lost_flush_completion(on):
    """Three RECVs on the client, then rdma_disconnect (the QP to ERR): three flushes, or
    the first missing."""
    with lab_with("lost_flush_completion", on) as lab:
        pair = CmPair(lab)
        for wr_id in (1, 2, 3):
            pair.client.post_recv(wr_id=wr_id)
        pair.client.conn.disconnect()
        lab.run_for(ms(10))
        wcs = pair.client.poll()
        assert {wc.status for wc in wcs} == {"WR_FLUSH_ERR"}
        assert [wc.wr_id for wc in wcs] == ([2, 3] if on else [1, 2, 3])


@pytest.mark.parametrize("on", [False, True])
def test_handler_after_destroy(on):
    """A QP's first handler takes 5 ms; a second event queues behind it; the dispatcher
    destroys the QP meanwhile. Clean: the queued event is dropped. Mutated: its handler
    begins after destroy_end."""
    with lab_with("handler_after_destroy", on) as lab:
        player = Player(lab, "a")
        qp, qpn = player.qp, player.qp.qp_num
        seen = []

        def handler(ev):
            seen.append(ev)
            if len(seen) == 1:
                lab.sleep(ms(5))

        with Dispatcher(lab, player.ctx) as d:
            d.watch(qp, handler)
            lab.faults.inject_async_event("a", "QP_FATAL", qpn)
            lab.wait_until(lambda: bool(seen), ms(10), "the first handler")
            lab.faults.after(ms(1), lambda: lab.faults.inject_async_event("a", "QP_REQ_ERR",
                                                                          qpn))
            lab.sleep(ms(2))
            label = qp.label
            d.destroy(qp)
            lab.run_for(ms(10))
        records = [r for r in lab.history() if r["object"] == label]
        end = next(r["seq"] for r in records if r["kind"] == "destroy_end")
        late = [r for r in records if r["kind"] == "handler_begin" and r["seq"] > end]
        assert len(late) == (1 if on else 0)
        assert len(seen) == (2 if on else 1)


@pytest.mark.parametrize("personality", ["ib", "roce", "iwarp-siw", "iwarp-cxgb4"])
@pytest.mark.parametrize("on", [False, True])
def test_missing_disconnected(on, personality):
    """The client disconnects: the server (the passive closer) sees DISCONNECTED, or waits in
    vain (Hung)."""
    with lab_with("missing_disconnected", on, personality) as lab:
        pair = CmPair(lab)
        pair.client.conn.disconnect()
        if on:
            with pytest.raises(Hung):
                pair.server.conn.wait("DISCONNECTED", ms(100))
        else:
            pair.server.conn.wait("DISCONNECTED", ms(100))
        pair.server.conn.disconnect()
        pair.client.conn.wait("DISCONNECTED", ms(100))  # the active closer is told either way
        assert pair.server.conn.count("DISCONNECTED") == (0 if on else 1)


@pytest.mark.parametrize("personality", ["ib", "roce"])
@pytest.mark.parametrize("on", [False, True])
def test_double_timewait_exit(on, personality):
    """Both sides close and wait out the IB CM's TIMEWAIT: one TIMEWAIT_EXIT each, or two."""
    with lab_with("double_timewait_exit", on, personality) as lab:
        pair = CmPair(lab)
        pair.disconnect()
        lab.run_for(sec(5))
        for side in pair.players:
            assert side.conn.count("TIMEWAIT_EXIT") == (2 if on else 1)


@pytest.mark.parametrize("on", [False, True])
def test_destroy_ignores_unacked(on):
    """The client's DISCONNECTED is read but its ack held; rdma_destroy_id. Clean: EBUSY at
    the deadline, the id still there. Mutated: destroy returns at once."""
    with lab_with("destroy_ignores_unacked", on) as lab:
        pair = CmPair(lab)
        pair.client_channel.hold_acks(pair.client.conn)
        pair.disconnect()
        assert pair.client_channel.held_acks(pair.client.conn) == 1
        pair.client.mr.dereg()
        t0 = lab.now_ns
        if on:
            pair.client.conn.destroy(ms(10))
            assert lab.now_ns == t0
        else:
            with pytest.raises(Error) as err:
                pair.client.conn.destroy(ms(10))
            assert err.value.errno_name == "EBUSY"
            assert lab.now_ns == t0 + ms(10)
        pair.client_channel.release_acks(pair.client.conn)
