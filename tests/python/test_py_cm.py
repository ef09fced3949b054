"""The Python layer of rdma_cm (rdmalab.api.cm): names and values, CmPair on each transport, the
event history per id, errors naming the verb, Hung dumps naming the stuck id, handlers,
shutdown and reboot. Protocol behaviour is for tests/scenarios."""

import errno

import pytest

import rdmalab
from rdmalab import ms, sec
from rdmalab.api.cm_values import (CM_EVENTS, CmEvent, CmEventError, CmEventRecord,
                                   make_conn_param, make_timing, status_name)
from rdmalab.api.resources import CmPair

PERSONALITIES = ["ib", "roce", "iwarp-cxgb4", "iwarp-siw"]


@pytest.fixture(params=PERSONALITIES)
def any_lab(request):
    with rdmalab.model_lab(seed=5, hosts={"a": request.param, "b": request.param}) as lab:
        yield lab


@pytest.fixture
def ib_lab():
    with rdmalab.model_lab(seed=1, hosts={"a": "ib", "b": "ib"}) as lab:
        yield lab


def channels(lab):
    return (lab.host("a").process("client").event_channel(),
            lab.host("b").process("server").event_channel())


# -- names and values

def test_event_names_follow_librdmacm_order():
    assert CM_EVENTS[0] == "ADDR_RESOLVED"
    assert CM_EVENTS[CM_EVENTS.index("DISCONNECTED")] == "DISCONNECTED"
    assert CM_EVENTS.index("DISCONNECTED") == 10  # RDMA_CM_EVENT_DISCONNECTED
    assert CM_EVENTS[-1] == "TIMEWAIT_EXIT"
    assert rdmalab._core.CmEventType.REJECTED.name == "REJECTED"


def test_status_names():
    assert status_name("DISCONNECTED", -errno.ETIMEDOUT) == "ETIMEDOUT"
    assert status_name("REJECTED", 10) == "STALE_CONN"
    assert status_name("REJECTED", 28) == "CONSUMER_DEFINED"
    assert status_name("REJECTED", -errno.ECONNREFUSED) == "ECONNREFUSED"
    assert status_name("ESTABLISHED", 0) == "OK"


def test_timing_and_param_builders():
    t = make_timing({"cm_response_timeout": 16}, max_cm_retries=3)
    assert (t.cm_response_timeout, t.max_cm_retries, t.packet_life_time) == (16, 3, 18)
    assert make_timing() is None
    with pytest.raises(TypeError, match="unknown CM timing"):
        make_timing(retries=3)
    p = make_conn_param(b"hi", retry_count=3)
    assert (p.private_data, p.retry_count) == (b"hi", 3)
    with pytest.raises(TypeError, match="unknown connection parameter"):
        make_conn_param(b"", depth=1)


# -- CmPair and the event history

def test_cm_pair_connects_and_carries_traffic(any_lab):
    pair = CmPair(any_lab)
    client, server = pair.client, pair.server
    assert client.qp.state == "RTS" and server.qp.state == "RTS"
    assert client.conn.cm_state == "CONNECT" and server.conn.cm_state == "CONNECT"
    assert [e.name for e in client.conn.events] == ["ADDR_RESOLVED", "ROUTE_RESOLVED",
                                                     "ESTABLISHED"]
    assert [e.name for e in server.conn.events] == ["CONNECT_REQUEST", "ESTABLISHED"]
    assert [e.name for e in pair.listener.events] == ["CONNECT_REQUEST"]
    records = client.conn.events
    assert all(isinstance(r, CmEventRecord) and r.status == 0 for r in records)
    assert [r.t_ns for r in records] == sorted(r.t_ns for r in records)

    server.mr.write(0, b"\0" * 8)
    client.mr.write(0, b"cm-data!")
    server.post_recv(length=8)
    client.post_send(length=8)
    assert server.wait_completions(1, ms(10)) and client.wait_completions(1, ms(10))
    assert server.mr.read(0, 8) == b"cm-data!"
    assert client.traffic.check().exactly_once() and server.traffic.check().exactly_once()

    pair.disconnect(ms(100))
    assert client.conn.count("DISCONNECTED") == 1 and server.conn.count("DISCONNECTED") == 1
    pair.close()
    assert client.conn.destroyed and server.conn.destroyed and pair.listener.destroyed
    assert client.qp.destroyed and client.cq.destroyed and client.pd.destroyed


def test_request_carries_private_data_and_wait_returns_event(ib_lab):
    cch, sch = channels(ib_lab)
    listener = sch.listen(7471)
    conn = cch.connect("b", 7471, private_data=b"hello")
    req = listener.wait_request(ms(10))
    assert isinstance(req.request, CmEvent)
    assert req.request.event == "CONNECT_REQUEST" and req.request.listen_id == listener.id
    assert req.request.private_data.startswith(b"hello")
    assert req.role == "passive side" and conn.role == "active side"
    req.accept(b"welcome")
    ev = conn.wait("ESTABLISHED", ms(10))
    assert (ev.event, ev.status, ev.status_name, ev.id) == ("ESTABLISHED", 0, "OK", conn.id)
    assert ev.private_data.startswith(b"welcome")
    assert conn.wait("ESTABLISHED", ms(1)) == ev  # already read: returns at once


def test_reject_ends_the_wait_with_the_event(ib_lab):
    cch, sch = channels(ib_lab)
    listener = sch.listen(7471)
    conn = cch.connect("b", 7471)
    listener.wait_request(ms(10)).reject(b"busy")
    with pytest.raises(CmEventError) as info:
        conn.wait("ESTABLISHED", sec(1))
    e = info.value
    assert isinstance(e, rdmalab.Error)
    assert e.verb == "rdma_get_cm_event" and e.errno == errno.ECONNREFUSED
    assert e.event.event == "REJECTED" and e.event.status_name == "CONSUMER_DEFINED"
    assert "REJECTED" in str(e) and conn.label in str(e)
    assert conn.wait("REJECTED", ms(1)).private_data.startswith(b"busy")


# -- Hung names the stuck id

def test_hung_names_the_stuck_id_and_its_events(ib_lab):
    cch, sch = channels(ib_lab)
    sch.listen(7471)
    ib_lab.faults.drop(src_host="a", dst_host="b")
    conn = cch.connect("b", 7471)
    with pytest.raises(rdmalab.Hung) as info:
        conn.wait("ESTABLISHED", ms(1))
    e = info.value
    assert e.verb == "rdma_get_cm_event" and e.errno == errno.ETIMEDOUT
    assert f"active side {conn.label} on a stuck in CONNECT/" in e.what
    assert "waiting for ESTABLISHED" in e.what
    assert "events: ADDR_RESOLVED, ROUTE_RESOLVED" in e.what
    assert f"seed={ib_lab.seed}" in str(e) and e.what in str(e)


def test_hung_wait_request_names_the_listener(ib_lab):
    _, sch = channels(ib_lab)
    listener = sch.listen(7471)
    with pytest.raises(rdmalab.Hung) as info:
        listener.wait_request(ms(1))
    assert f"listener {listener.label} on b stuck in LISTEN" in info.value.what
    assert "waiting for CONNECT_REQUEST (events: none)" in info.value.what


# -- bad input: rdmalab.Error naming the verb, never a crash or a hang

def test_unknown_host_fails_resolve(ib_lab):
    cch, _ = channels(ib_lab)
    with pytest.raises(rdmalab.Error) as info:
        cch.connect("nowhere", 7471, timeout_ns=ms(10))
    assert not isinstance(info.value, rdmalab.Hung)
    assert info.value.verb == "rdma_resolve_addr"


@pytest.mark.parametrize("port", [-1, 70000])
def test_port_out_of_range(ib_lab, port):
    cch, sch = channels(ib_lab)
    with pytest.raises(rdmalab.Error) as info:
        sch.listen(port)
    assert (info.value.verb, info.value.errno) == ("rdma_listen", errno.EINVAL)
    with pytest.raises(rdmalab.Error) as info:
        cch.connect("b", port)
    assert (info.value.verb, info.value.errno) == ("rdma_resolve_addr", errno.EINVAL)
    with pytest.raises(TypeError):
        sch.listen("7471")


def test_connect_on_listening_id_and_accept_twice(ib_lab):
    cch, sch = channels(ib_lab)
    listener = sch.listen(7471)
    with pytest.raises(rdmalab.Error) as info:
        listener.connect()
    assert info.value.verb == "rdma_connect" and info.value.errno
    cch.connect("b", 7471)
    req = listener.wait_request(ms(10))
    req.accept()
    with pytest.raises(rdmalab.Error) as info:
        req.accept()
    assert info.value.verb == "rdma_accept" and info.value.errno
    with pytest.raises(ValueError, match="unknown CM event"):
        req.wait("CONNECTED")


# -- handlers, destroy, shutdown

def test_listener_handler_sees_new_ids_events(ib_lab):
    cch, sch = channels(ib_lab)
    listener = sch.listen(7471)
    seen = []
    sch.watch(listener, lambda ev: seen.append((ev.event, ev.id)))
    conn = cch.connect("b", 7471)
    req = listener.wait_request(ms(10))
    req.accept()
    conn.wait("ESTABLISHED", ms(10))
    ib_lab.wait_until(lambda: len(seen) == 2, ms(10), what="two handled events")
    assert seen == [("CONNECT_REQUEST", req.id), ("ESTABLISHED", req.id)]
    assert sch.stats().max_concurrent_per_id == 1


def test_raising_handler_is_reraised_and_counted(ib_lab):
    cch, _ = channels(ib_lab)
    cm_id = cch.create_id()

    def bad(ev):
        raise KeyError("handler bug")

    cch.watch(cm_id, bad)
    cm_id.resolve_addr("b", 7471)
    with pytest.raises(KeyError):
        ib_lab.run_for(ms(1))
    assert cch.stats().handler_errors == 1
    cm_id.destroy(ms(1))  # the failed handler's event was acked all the same
    assert cm_id.destroyed


def test_close_destroys_ids_and_shutdown_stops_pumps():
    with rdmalab.model_lab(seed=2, hosts={"a": "iwarp-siw", "b": "iwarp-siw"}) as lab:
        pair = CmPair(lab)
        other = lab.host("a").process("idle").event_channel()
        assert other.running
        pair.close()
        assert all(i.destroyed for i in pair.client_channel.ids + pair.server_channel.ids)
        assert not pair.client_channel.running
    assert not other.running


def test_reboot_kills_the_host_processes():
    hosts = {"a": "roce", "b": "roce", "c": "roce"}
    with rdmalab.model_lab(seed=3, hosts=hosts) as lab:
        pair = CmPair(lab)
        lab.faults.reboot("b", ms(50))
        assert not pair.server.proc.alive
        lab.run_for(ms(60))
        # A fresh peer (c holds no connection to b's reused QPN: no stale REJ) reaches b again.
        again = CmPair(lab, server="b", client="c", process_server="server-2")
        assert again.server.qp.state == "RTS" and again.server.qp.qp_num == pair.server.qp.qp_num


def test_same_seed_same_history_with_pumps():
    def run():
        with rdmalab.model_lab(seed=11, hosts={"a": "ib", "b": "ib"}) as lab:
            pair = CmPair(lab)
            pair.disconnect(ms(100))
            pair.close()
            return lab._o.history_jsonl()

    first, second = run(), run()
    assert '"kind":"cm_event_dispatched"' in first
    assert first == second


def test_close_destroys_requests_nobody_took(ib_lab):
    cch, sch = channels(ib_lab)
    listener = sch.listen(7471)
    cch.connect("b", 7471)
    cch.connect("b", 7471)
    listener.wait_request(ms(10))
    ib_lab.wait_until(lambda: listener.count("CONNECT_REQUEST") == 2, ms(10), what="2 requests")
    sch.close()  # would be EBUSY (rdma_destroy_event_channel) with the second id left
    assert len(sch.ids) == 3 and all(i.destroyed for i in sch.ids)


def test_watch_counts_without_deciding(ib_lab):
    """A watch rule counts the packets it matches and lets the rules after it decide: the
    DREP is both counted and dropped."""
    pair = CmPair(ib_lab)
    seen = ib_lab.faults.watch(cm="DREP")
    dropped = ib_lab.faults.drop(cm="DREP", count=1)
    pair.client.conn.disconnect()
    pair.server.conn.wait("DISCONNECTED", ms(100))
    pair.server.conn.disconnect()          # the DREP goes out now
    ib_lab.run_for(ms(50))
    assert seen.hits == 1 and dropped.hits == 1
    assert ib_lab.faults.counts().get("drop") == 1


def test_unread_event_is_discarded_by_destroy_id(any_lab):
    """With the pump paused the peer's DISCONNECTED waits unread in the channel; the model's
    rdma_destroy_id drops it (ucma_cleanup_ctx_events): a cm_event_dropped record, never a
    cm_event_read, and no wait for an ack."""
    lab = any_lab
    pair = CmPair(lab)
    server, ch = pair.server.conn, pair.server_channel
    ch.pause_reading()
    pair.client.conn.disconnect()
    lab.run_for(ms(100))
    label = f"cm_id:{server.id}"
    assert not [r for r in lab.history() if r["object"] == label and r["kind"] == "cm_event_read"
                and r["data"]["event"] == "DISCONNECTED"]
    t0 = lab.now_ns
    pair.server.close()
    assert lab.now_ns == t0
    dropped = [r["data"]["event"] for r in lab.history()
               if r["object"] == label and r["kind"] == "cm_event_dropped"]
    assert dropped == ["DISCONNECTED"]
    ch.resume_reading()
    lab.run_for(ms(100))
    assert "DISCONNECTED" not in [e.name for e in server.events]


def test_close_after_a_side_was_closed(any_lab):
    pair = CmPair(any_lab)
    pair.server.close()  # the passive id (taken with wait_request) destroyed on its own
    pair.close()         # its CONNECT_REQUEST is still in the listener's events
    assert all(i.destroyed for i in pair.client_channel.ids + pair.server_channel.ids)
    assert not pair.server_channel.running


def test_close_when_a_request_id_is_gone(any_lab):
    """An unread CONNECT_REQUEST whose id was destroyed below the CmChannel (through the pump,
    never wrapped): the engine no longer knows it (ENOENT), and close takes it as gone."""
    cch, sch = channels(any_lab)
    listener = sch.listen(7471)
    cch.connect("b", 7471)
    any_lab.wait_until(lambda: listener.count("CONNECT_REQUEST") == 1, ms(10), what="a request")
    (req,) = listener.event_list()
    sch._pump.destroy_id(sch._o.cm_id(req.id), any_lab.now_ns + ms(10))
    sch.close()
    assert not sch.running and all(i.destroyed for i in sch.ids)
    assert req.id not in [i.id for i in sch.ids]
