"""Model against device for one schedule (rdmalab.schedules.differential): outcomes keyed by
the schedule's names, what is compared and what is not."""
from rdmalab.schedules import differential as df


def rec(seq, host, obj, kind, **data):
    return {"seq": seq, "t_ns": seq, "host": host, "object": obj, "kind": kind, "data": data}


def history(events_b, wc_status="SUCCESS", wc_opcode="RECV", after_teardown=()):
    h = [rec(1, "", "schedule", "schedule_step", i=0, op="connect", result="ok"),
         # the device's event may come before the controller's bind record
         rec(2, "b", "cm_id:7", "cm_event", event="CONNECT_REQUEST", status=0),
         rec(3, "b", "schedule", "schedule_bind", conn="c0", side="server", process="p0",
             cm_id="cm_id:7", qp_num=17)]
    seq = 4
    for name, status in events_b:
        h.append(rec(seq, "b", "cm_id:7", "cm_event", event=name, status=status))
        seq += 1
    h.append(rec(seq, "b", "qp:3", "wc", qp_num=17, wr_id=5, opcode=wc_opcode,
                 status=wc_status))
    h.append(rec(seq + 1, "", "schedule", "teardown_begin"))
    for i, (name, status) in enumerate(after_teardown):
        h.append(rec(seq + 2 + i, "b", "cm_id:7", "cm_event", event=name, status=status))
    return h


def test_outcome_keys_by_the_schedule_and_binds_before_it_maps():
    out = df.outcome(history([("ESTABLISHED", 0)]))
    assert out["c0/server"]["events"] == ["CONNECT_REQUEST(0)", "ESTABLISHED(0)"]
    assert out["c0/server"]["wc"] == {"5": "RECV:SUCCESS"}
    assert out["steps"] == [[0, "connect", "ok", ""]]


def test_events_after_teardown_begin_are_not_compared():
    a = df.outcome(history([("ESTABLISHED", 0)]))
    b = df.outcome(history([("ESTABLISHED", 0)], after_teardown=[("DISCONNECTED", 0)]))
    assert df.differences(a, b) == []


def test_an_error_completion_is_its_status_alone():
    a = df.outcome(history([], "WR_FLUSH_ERR", "RECV"))
    b = df.outcome(history([], "WR_FLUSH_ERR", "SEND"))  # opcode not valid (ibv_poll_cq(3))
    assert df.differences(a, b) == []


def test_success_against_flush_is_timing_and_a_status_is_a_candidate():
    a = df.outcome(history([("ESTABLISHED", 0)], "WR_FLUSH_ERR"))
    b = df.outcome(history([("ESTABLISHED", 0)], "SUCCESS"))
    diffs = df.differences(a, b)
    assert diffs == ["timing: c0/server wr 5: model WR_FLUSH_ERR, device RECV:SUCCESS"]
    assert df.candidates(diffs) == []
    c = df.outcome(history([("ESTABLISHED", 0), ("DISCONNECTED", 0)], "WR_RETRY_EXC_ERR"))
    diffs = df.differences(a, c)
    assert df.candidates(diffs) == diffs and len(diffs) == 2
    assert "c0/server events: model ['CONNECT_REQUEST(0)', 'ESTABLISHED(0)'], device " \
           "['CONNECT_REQUEST(0)', 'ESTABLISHED(0)', 'DISCONNECTED(0)']" in diffs


def test_a_port_event_is_the_hosts_and_only_what_a_dispatcher_got_counts():
    """Async events are compared as the application's Dispatcher got them (event_dispatched):
    a port event per host, a QP event by its QP. The model's raise records (async_event, with
    the port as `number`) are not compared: a device records none where no process has the
    device open (vm:rxe seed 6), and the model's number once made PORT_ERR QP 1's (vm:siw
    seed 1)."""
    model = history([("ESTABLISHED", 0)])
    model[3:3] = [rec(29, "b", "port:1", "async_event", event="PORT_ERR", number=17),
                  rec(30, "b", "default", "event_dispatched", event="PORT_ERR", qp_num=0),
                  rec(31, "b", "default", "event_dispatched", event="QP_FATAL", qp_num=17)]
    device = history([("ESTABLISHED", 0)])
    device[3:3] = [rec(30, "b", "default", "event_dispatched", event="PORT_ERR", qp_num=0),
                   rec(31, "b", "default", "event_dispatched", event="QP_FATAL", qp_num=17)]
    a, b = df.outcome(model), df.outcome(device)
    assert a["b/device"]["async"] == b["b/device"]["async"] == ["PORT_ERR"]
    assert a["c0/server"]["async"] == b["c0/server"]["async"] == ["QP_FATAL"]
    assert df.differences(a, b) == []
    device.pop(4)  # the device's QP_FATAL never dispatched: a difference on the QP's side
    assert df.differences(a, df.outcome(device)) == \
        ["c0/server async events: model ['QP_FATAL'], device []"]


def test_a_reused_qp_number_is_told_apart_by_the_qp_label():
    """vm:siw seed 3: c0's QP (number 1) was destroyed and c2's got number 1 again; the
    completion of c0's WR belongs to c0, by the QP label the bind names."""
    h = history([("ESTABLISHED", 0)])
    h[2]["data"]["qp"] = "qp:3"
    end = h.index(next(r for r in h if r["kind"] == "teardown_begin"))
    h[end:end] = [rec(50, "b", "schedule", "schedule_bind", conn="c2", side="server",
                      process="p0", cm_id="cm_id:9", qp_num=17, qp="qp:8"),
                  rec(51, "b", "qp:8", "wc", qp_num=17, wr_id=9, opcode="SEND",
                      status="SUCCESS")]
    out = df.outcome(h)
    assert out["c0/server"]["wc"] == {"5": "RECV:SUCCESS"}
    assert out["c2/server"]["wc"] == {"9": "SEND:SUCCESS"}
    for r in h:  # no labels (an older history): the QP number bound last before the record
        r["data"].pop("qp", None)
    out = df.outcome(h)
    assert out["c0/server"]["wc"] == {"5": "RECV:SUCCESS"}
    assert out["c2/server"]["wc"] == {"9": "SEND:SUCCESS"}


def test_a_step_the_device_cannot_do_is_left_out_on_both_sides():
    """vm:siw seed 4: injecting QP_REQ_ERR is unsupported on siw; the model runs the schedule
    without that step (a 0-ns wait keeps the step numbers), and the result line is a note."""
    from rdmalab.schedules import Schedule
    s = Schedule.from_json({"rdmalab_schedule": 1, "seed": 4, "hosts": ["a", "b"], "steps": [
        {"op": "connect", "conn": "c0", "client": "a", "server": "b"},
        {"op": "async_event", "conn": "c0", "side": "server", "event": "QP_REQ_ERR"},
        {"op": "disconnect", "conn": "c0", "side": "client"}]})
    device = {"steps": [[0, "connect", "ok", ""], [1, "async_event", "unsupported", ""],
                        [2, "disconnect", "ok", ""]]}
    assert df.unsupported_steps(device) == [1]
    t = df.without_steps(s, [1])
    assert t.steps[1] == {"op": "wait", "ns": 0} and t.steps[2] == s.steps[2]
    model = {"steps": [[0, "connect", "ok", ""], [1, "wait", "ok", ""],
                       [2, "disconnect", "ok", ""]]}
    notes = df.skip_steps(model, device, [1])
    assert df.differences(model, device) == []
    assert notes and df.candidates(notes) == []
