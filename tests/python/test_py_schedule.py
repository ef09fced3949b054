"""Fault schedules as data: validation, files, the runner on the model, moments, the swarm's
draw and the shrinker."""
import json
import pathlib
import re
import subprocess
import sys

import pytest

import rdmalab
from rdmalab import ms, sec
from rdmalab.schedules import Runner, Schedule, ScheduleError
from rdmalab.run import swarm_cli
from rdmalab.schedules import shrink, swarm

REPO = pathlib.Path(__file__).resolve().parents[2]


def sched(steps, hosts=("a", "b"), **kw):
    return Schedule.from_json({"rdmalab_schedule": 1, "hosts": list(hosts), "steps": steps,
                               **kw})


BASIC = [{"op": "connect", "conn": "c0", "client": "a", "server": "b"},
         {"op": "recv", "conn": "c0", "side": "server", "n": 2},
         {"op": "post", "conn": "c0", "side": "client", "opcode": "SEND", "n": 2},
         {"op": "wait", "ns": ms(1)},  # steps run at once: let the SENDs go before the close
         {"op": "disconnect", "conn": "c0", "side": "client"}]


@pytest.mark.parametrize("steps,needle", [
    ([{"op": "explode"}], "step 0: op 'explode' unknown"),
    ([{"op": "recv", "conn": "c0", "side": "server"}], "conn 'c0' is not made by an earlier"),
    ([{"op": "connect", "conn": "c0", "client": "a", "server": "z"}], "server 'z' is not one"),
    ([{"op": "connect", "conn": "c0", "client": "a"}], "field 'server' missing"),
    ([BASIC[0], {"op": "post", "conn": "c0", "side": "left"}], "side 'left'"),
    ([BASIC[0], {"op": "post", "conn": "c0", "side": "client", "opcode": "ATOMIC"}],
     "opcode 'ATOMIC'"),
    ([BASIC[0], {"op": "post", "conn": "c0", "side": "client", "n": "3"}], "n='3': int"),
    ([BASIC[0], {"op": "wait", "ns": 5, "colour": 1}], "unknown field(s) ['colour']"),
    ([BASIC[0], {"op": "kill", "host": "a", "process": "p0", "at": {"moment": "soon"}}],
     "step 1 (kill) at: {\"moment\": ...}"),
    ([BASIC[0], {"op": "kill", "host": "a", "process": "p0",
                 "at": {"moment": "cm_msg", "msg": "HELLO"}}], "msg 'HELLO'"),
    ([{"op": "unrule", "name": "r9"}], "no rule named 'r9'"),
])
def test_malformed_schedules_name_the_step_and_field(steps, needle):
    with pytest.raises(ScheduleError) as e:
        sched(steps)
    assert needle in str(e.value)


def at(moment: dict, **step) -> list:
    """BASIC's connect, then a kill at that moment."""
    return [BASIC[0], {"op": "kill", "host": "a", "process": "p0", "at": moment, **step}]


C0 = {"conn": "c0", "side": "server"}


# Issue 26: each was accepted (and the step silently skipped), or a traceback at run time.
@pytest.mark.parametrize("steps,needle", [
    # names checked against their tables: rdma_cm events (_core.CmEventType), CM protocol
    # states (IB CM and iWARP CM), the verbs a verb moment can see on a side's QP
    (at({"moment": "cm_event", **C0, "event": "DISCONECTED"}),
     "step 1 (kill) at cm_event: event 'DISCONECTED' unknown; allowed: ADDR_RESOLVED"),
    (at({"moment": "cm_state", **C0, "state": "DREQ_SNET"}),
     "step 1 (kill) at cm_state: state 'DREQ_SNET' unknown; allowed: IDLE"),
    (at({"moment": "verb", **C0, "verb": "ibv_destroy_q"}),
     "step 1 (kill) at verb: verb 'ibv_destroy_q' unknown; allowed: ibv_modify_qp"),
    (at({"moment": "verb", **C0, "verb": "ibv_poll_cq"}),  # names no QP: could never fire
     "verb 'ibv_poll_cq' unknown"),
    # negative durations and counts
    (at({"moment": "after", "ns": -1}), "step 1 (kill) at after: ns must be >= 0, got -1"),
    (at({"moment": "cm_event", **C0, "event": "DISCONNECTED", "within_ns": -5}),
     "step 1 (kill) at cm_event: within_ns must be >= 0, got -5"),
    (at({"moment": "cm_msg", "msg": "DREQ", "n": 0}),
     "step 1 (kill) at cm_msg: n must be >= 1, got 0"),
    (at({"moment": "cm_msg", "msg": "DREQ", "n": -2}), "n must be >= 1, got -2"),
    ([BASIC[0], {"op": "wait", "ns": -1}], "step 1 (wait): ns must be >= 0, got -1"),
    ([BASIC[0], {"op": "wait", "ns": 10**20}], "step 1 (wait): ns must be <= 86400000000000"),
    ([BASIC[0], {"op": "reboot", "host": "b", "down_ns": -1}], "down_ns must be >= 0"),
    # may_miss: a bool, on a step with a moment
    (at({"moment": "after", "ns": 1}, may_miss="yes"), "step 1 (kill): may_miss='yes': bool"),
    ([BASIC[0], {"op": "wait", "ns": 1, "may_miss": True}],
     "step 1 (wait): may_miss: only a step with an \"at\" moment"),
    # the rule, by the fault switch's own parser
    ([{"op": "rule", "name": "r0", "rule": {"action": "drop", "cm": "DREQQ"}}],
     "step 0 (rule): rule.cm: unknown CM message \"DREQQ\""),
    ([{"op": "rule", "name": "r0", "rule": {"action": "explode"}}],
     "step 0 (rule): rule.action: unknown action 'explode'"),
    ([{"op": "rule", "name": "r0", "rule": {"action": "drop", "count": -1}}],
     "step 0 (rule): rule.count: expected an integer >= 0, got -1"),
    # names of the wrong type (a traceback before: unhashable)
    ([{"op": ["connect"]}], "step 0: op ['connect'] unknown"),
    (at({"moment": ["after"], "ns": 1}), "step 1 (kill) at: {\"moment\": ...} with one of"),
    # a connect's moment on its own connection (it could never come)
    ([{"op": "connect", "conn": "c0", "client": "a", "server": "b",
       "at": {"moment": "cm_event", **C0, "event": "ESTABLISHED"}}],
     "step 0 (connect) at cm_event: conn 'c0' is not made by an earlier connect step"),
])
def test_every_closed_set_and_bound_is_checked(steps, needle):
    with pytest.raises(ScheduleError) as e:
        sched(steps)
    assert needle in str(e.value)


@pytest.mark.parametrize("head,needle", [
    ({"personality": "rocee"}, "personality 'rocee' unknown; known: roce, ib"),
    ({"personality": 7}, "personality=7: str expected"),
    ({"settle_ns": -1}, "settle_ns must be >= 0, got -1"),
    ({"pace_ns": -1}, "pace_ns must be >= 0, got -1"),
    ({"seed": -3}, "seed must be >= 0, got -3"),
    ({"seed": 2**64}, "seed must be <= 18446744073709551615"),
    ({"meta": [1, 2]}, "meta=[1, 2]: a JSON object expected"),
])
def test_the_schedules_own_fields_are_checked(head, needle):
    with pytest.raises(ScheduleError) as e:
        sched(BASIC, **head)
    assert needle in str(e.value)
    # a Schedule made in code is checked as a file is
    if isinstance(head.get("personality", ""), str) and "meta" not in head:
        with pytest.raises(ScheduleError, match=re.escape(needle)):
            Schedule(hosts=["a", "b"], steps=BASIC, **head).validate()


def test_the_tables_are_the_labs_own():
    """The names a schedule is checked against come from where the lab reads them."""
    from rdmalab import _core
    from rdmalab.schedules import VERB_MOMENTS, cm_events, cm_protocol_states
    assert set(cm_events()) == set(_core.CmEventType.__members__)
    # cm_state: the states of core/model/cm_ib.h and cm_iw.h, whose names the model's
    # protocol_state gives
    states = set()
    for header, enum in (("cm_ib.h", "IbCmState"), ("cm_iw.h", "IwCmState")):
        text = (REPO / "core" / "model" / header).read_text()
        body = re.search(r"enum class " + enum + r"\s*{([^}]*)}", text).group(1)
        states |= {w for w in re.findall(r"[A-Z_]+", body)}
    assert set(cm_protocol_states()) == states
    # verb: the verbs the model enters with the QP's number (lab.faults.on_verb's call.qp_num)
    entered = set()
    for src in (REPO / "core" / "model").glob("*.cc"):
        entered |= set(re.findall(r'\benter\("(\w+)",', src.read_text()))  # (verb, qp_num)
    assert set(VERB_MOMENTS) == entered
    # and on the model, those verbs and only those reach the hook with a QP number
    seen = set()
    with rdmalab.model_lab(seed=3, hosts=("a", "b"), personality="roce") as lab:
        lab.faults.on_verb(lambda call: seen.add(call.verb) if call.qp_num else None)
        Runner(lab, sched(BASIC + [{"op": "destroy", "conn": "c0", "side": "client"}]),
               settle_ns=0).run()
    assert seen <= set(VERB_MOMENTS) and "ibv_destroy_qp" in seen


def test_a_malformed_schedule_is_bad_input_for_replay(tmp_path):
    """`rdmalab replay` answers an unknown cm_event name with exit 2 naming the step and the
    field (it was a traceback, exit 1)."""
    bad = tmp_path / "bad.json"
    sched(BASIC).dump(bad)
    obj = json.loads(bad.read_text())
    obj["steps"].append({"op": "wait", "ns": 1, "at": {"moment": "cm_event", **C0,
                                                       "event": "DISCONECTED"}})
    bad.write_text(json.dumps(obj))
    p = subprocess.run([sys.executable, "-m", "rdmalab", "replay", str(bad), "--lab",
                        "model:roce", "--out", str(tmp_path / "out")], cwd=REPO,
                       env={"PYTHONPATH": str(pathlib.Path(rdmalab.__file__).parents[1]),
                            "PATH": "/usr/bin:/bin"},
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "step 5 (wait) at cm_event: event 'DISCONECTED' unknown" in p.stderr
    assert "Traceback" not in p.stderr


def test_a_file_round_trips_and_a_bad_file_names_its_line(tmp_path):
    s = sched(BASIC, seed=9, personality="ib")
    path = s.dump(tmp_path / "s.json")
    back = Schedule.load(path)
    assert back.steps == s.steps and back.seed == 9 and back.personality == "ib"
    bad = tmp_path / "bad.json"
    bad.write_text('{"rdmalab_schedule": 1,\n "hosts": [}')
    with pytest.raises(ScheduleError, match=r"bad.json:2:\d+: not JSON"):
        Schedule.load(bad)
    with pytest.raises(ScheduleError, match="rdmalab_schedule"):
        Schedule.from_json({"hosts": ["a"], "steps": []})


def test_the_runner_records_each_step_and_tears_everything_down():
    lab = rdmalab.model_lab(seed=3, hosts=("a", "b"), personality="roce")
    with lab:
        out = Runner(lab, sched(BASIC)).run()
        hist = lab.history()
    assert [r["result"] for r in out.results] == ["ok"] * 5 and out.hung is None
    assert out.results[0]["detail"] == "established"
    binds = [r for r in hist if r["kind"] == "schedule_bind"]
    assert {(r["data"]["conn"], r["data"]["side"]) for r in binds} == {("c0", "client"),
                                                                       ("c0", "server")}
    teardown = [r for r in hist if r["kind"] == "teardown"]
    assert len(teardown) == 1
    # librdmacm keeps each device's context open for the process's life (ucma_init)
    assert all(set(held) <= {"ctx"} for held in teardown[0]["data"]["objects"].values())
    wcs = [r for r in hist if r["kind"] == "wc" and r["data"]["status"] == "SUCCESS"]
    assert len(wcs) >= 4  # two SENDs and two RECVs


def test_a_step_on_a_dead_object_is_a_result_not_an_exception():
    steps = BASIC + [{"op": "destroy", "conn": "c0", "side": "client"},
                     {"op": "post", "conn": "c0", "side": "client"}]
    lab = rdmalab.model_lab(seed=3, hosts=("a", "b"), personality="roce")
    with lab:
        out = Runner(lab, sched(steps)).run()
    assert out.results[-1]["result"] == "error"
    assert "already destroyed" in out.results[-1]["detail"]


def test_cm_msg_moment_waits_for_the_third_dreq():
    """A DREP lost for good: the kill runs once the third DREQ has gone out, i.e. two DREQ
    timeouts after the disconnect (4.6 s or more each on RoCE), not at once."""
    steps = [BASIC[0], {"op": "rule", "name": "r0", "rule": {"action": "drop", "cm": "DREP"}},
             {"op": "disconnect", "conn": "c0", "side": "client"},
             {"op": "wait", "ns": ms(10),
              "at": {"moment": "cm_msg", "msg": "DREQ", "n": 3, "src_host": "a",
                     "within_ns": sec(60)}}]
    lab = rdmalab.model_lab(seed=3, hosts=("a", "b"), personality="roce")
    with lab:
        Runner(lab, sched(steps), settle_ns=0).run()
        hist = lab.history()
    disc = next(r for r in hist if r["kind"] == "schedule_step" and r["data"]["i"] == 2)
    moment = next(r for r in hist if r["kind"] == "schedule_moment")
    dreqs = [r for r in hist if r["kind"] == "cm_send" and r["data"]["msg"] == "DREQ"
             and r["t_ns"] <= moment["t_ns"]]
    assert len(dreqs) == 3
    assert moment["t_ns"] - disc["t_ns"] >= 2 * 4 * 10**9


def test_verb_moment_fires_while_the_qp_is_destroyed():
    steps = [BASIC[0],
             {"op": "async_event", "conn": "c0", "side": "server", "event": "QP_FATAL",
              "driver_delay_ns": ms(1),
              "at": {"moment": "verb", "verb": "ibv_destroy_qp", "conn": "c0",
                     "side": "server"}},
             {"op": "destroy", "conn": "c0", "side": "server"}]
    lab = rdmalab.model_lab(seed=3, hosts=("a", "b"), personality="ib")
    with lab:
        out = Runner(lab, sched(steps)).run()
        hist = lab.history()
    by_i = {r["i"]: r for r in out.results}
    assert by_i[1]["result"] == "ok" and by_i[2]["result"] == "ok"
    # The moment fires at ibv_destroy_qp's entry: after the destroy step began, before the
    # verb's own record (written when it returns), with the injected event in between.
    fired = next(r for r in hist if r["kind"] == "schedule_moment")
    began = next(r for r in hist if r["kind"] == "destroy_begin" and r["host"] == "b")
    verb = next(r for r in hist if r["kind"] == "verb" and r["host"] == "b"
                and r["data"]["verb"] == "ibv_destroy_qp")
    injected = next(r for r in hist if r["kind"] == "fault" and r["host"] == "b"
                    and "QP_FATAL" in str(r["data"]))
    assert began["seq"] < fired["seq"] < injected["seq"] < verb["seq"]


def test_draw_is_a_function_of_the_seed():
    a, b = swarm.draw(11, "roce"), swarm.draw(11, "roce")
    assert json.dumps(a.to_json()) == json.dumps(b.to_json())
    assert json.dumps(swarm.draw(12, "roce").to_json()) != json.dumps(a.to_json())
    assert 28 <= len(a.steps) <= 32 and 2 <= len(a.hosts) <= 4
    a.validate()


def test_shrink_keeps_only_what_the_failure_needs():
    s = sched([BASIC[0], {"op": "wait", "ns": 5}, BASIC[1],
               {"op": "connect", "conn": "c1", "client": "b", "server": "a"},
               {"op": "post", "conn": "c1", "side": "client", "n": 3},
               {"op": "disconnect", "conn": "c0", "side": "server"}])

    def fails(x: Schedule) -> bool:  # "fails" while c1's client posts
        return any(st["op"] == "post" and st["conn"] == "c1" for st in x.steps)

    small, runs = shrink.shrink(s, fails)
    assert [st["op"] for st in small.steps] == ["connect", "post"]
    assert small.steps[1].get("n", 1) == 1 and runs > 0


def test_pace_puts_steps_apart():
    steps = [{"op": "wait", "ns": 0}, {"op": "wait", "ns": 0}, {"op": "wait", "ns": 0}]
    lab = rdmalab.model_lab(seed=3, hosts=("a", "b"), personality="roce")
    with lab:
        Runner(lab, sched(steps, pace_ns=ms(1)), settle_ns=0).run()
        t = [r["t_ns"] for r in lab.history() if r["kind"] == "schedule_step"]
    assert [b - a for a, b in zip(t, t[1:])] == [ms(1), ms(1)]


# ---- issue 26 item 2: a moment that never comes fails the run -----------------------------
# The DREP lost for good: the client's DREQs are answered by nothing, and the server (the
# passive closer) gets DISCONNECTED from the first DREQ. With the planted defect
# missing_disconnected it never does: the step waiting for it must fail the run.
DREP_LOSS = [BASIC[0],
             {"op": "rule", "name": "r0", "rule": {"action": "drop", "cm": "DREP"}},
             {"op": "recv", "conn": "c0", "side": "server", "n": 1},
             {"op": "disconnect", "conn": "c0", "side": "client"},
             {"op": "disconnect", "conn": "c0", "side": "server",
              "at": {"moment": "cm_event", **C0, "event": "DISCONNECTED"}}]
MISSED_DISCONNECTED = ("step 4 (disconnect): moment cm_event DISCONNECTED (conn c0 server) "
                       "never came within 30 s")


def test_a_moment_that_never_came_fails_the_replay_naming_the_step(capsys):
    s = sched(DREP_LOSS, seed=3, personality="roce")
    bad = swarm.run_on_model(s, "roce", ("missing_disconnected",), keep_history=True)
    assert bad.failed and "missed_moment" in bad.signature, bad.problems
    assert f"missed_moment: {MISSED_DISCONNECTED}" in bad.problems
    step4 = [r for r in bad.results if r["i"] == 4]
    assert [(r["result"], r["detail"]) for r in step4] == [("missed", MISSED_DISCONNECTED)]
    moment = [r["data"] for r in bad.history if r["kind"] == "schedule_moment"]
    assert moment == [{"i": 4, "moment": "cm_event", "missed": True, "may_miss": False}]
    # rdmalab replay: the problem printed, exit 1
    assert swarm_cli.replay_model(s, "roce", ["missing_disconnected"]) == 1
    assert MISSED_DISCONNECTED in capsys.readouterr().out
    # without the defect the moment comes and every checker is valid
    good = swarm.run_on_model(s, "roce")
    assert not good.failed, good.problems
    assert [r["result"] for r in good.results] == ["ok"] * 5


def test_a_step_that_may_miss_its_moment_is_skipped_not_failed():
    steps = [dict(st) for st in DREP_LOSS]
    steps[4]["may_miss"] = True
    s = sched(steps, seed=3, personality="roce")
    r = swarm.run_on_model(s, "roce", ("missing_disconnected",), keep_history=True)
    # No checker catches this defect on this schedule (the server id is destroyed at
    # teardown, which cm_terminal accepts as its end): the marked step is all there was.
    assert not r.failed, r.problems
    step4 = next(x for x in r.results if x["i"] == 4)
    assert step4["result"] == "skipped" and step4["detail"].endswith("(may_miss)")
    moment = next(x["data"] for x in r.history if x["kind"] == "schedule_moment")
    assert moment["missed"] and moment["may_miss"]


def test_a_trigger_armed_and_never_fired_fails_and_never_runs_at_teardown():
    steps = [BASIC[0],
             {"op": "async_event", "conn": "c0", "side": "server", "event": "QP_FATAL",
              "at": {"moment": "verb", "verb": "ibv_destroy_qp", **C0}},
             {"op": "wait", "ns": ms(1)}]
    lab = rdmalab.model_lab(seed=3, hosts=("a", "b"), personality="ib")
    with lab:
        out = Runner(lab, sched(steps)).run()
        hist = lab.history()
    want = ("step 1 (async_event): moment verb ibv_destroy_qp (conn c0 server) never came "
            "before the schedule's end")
    assert out.missed == [want]
    # the teardown's ibv_destroy_qp did not run the step after its result was given
    step1 = [r["data"] for r in hist if r["kind"] == "schedule_step" and r["data"]["i"] == 1]
    assert [d["result"] for d in step1] == ["missed"]
    assert not any(r["kind"] == "fault" and "QP_FATAL" in str(r["data"]) for r in hist)
    # qpn_reused never fired counts the same; may_miss lets the run pass
    steps = [BASIC[0], {"op": "wait", "ns": 1, "at": {"moment": "qpn_reused", "host": "a"}}]
    for may, missed in ((False, ["step 1 (wait): moment qpn_reused (host a) never came "
                                 "before the schedule's end"]), (True, [])):
        steps[1]["may_miss"] = may
        with rdmalab.model_lab(seed=3, hosts=("a", "b"), personality="ib") as lab:
            out = Runner(lab, sched(steps), settle_ns=0).run()
        assert out.missed == missed
        assert out.results[-1]["result"] == ("skipped" if may else "missed")


def test_the_swarm_marks_the_moments_that_may_not_come():
    """cm_state moments and anything after a disruptive step may miss; `after` never; a quiet
    run's destroy-time verb and first REQ/DREQ of its own connection must come; nothing
    cm_msg on iWARP (its CM sends no MADs)."""
    conn = {"op": "connect", "conn": "c0", "client": "a", "server": "b",
            "client_process": "p0", "server_process": "p1"}
    verb = {"op": "async_event", "conn": "c0", "side": "server", "event": "QP_FATAL",
            "at": {"moment": "verb", "verb": "ibv_destroy_qp", **C0}}
    destroy = {"op": "destroy", **C0}
    dreq = {"op": "destroy", "conn": "c0", "side": "client",
            "at": {"moment": "cm_msg", "msg": "DREQ", "n": 1}}
    state = {"op": "kill", "host": "b", "process": "p1",
             "at": {"moment": "cm_state", "conn": "c0", "side": "client", "state": "TIMEWAIT"}}
    rule = {"op": "rule", "name": "r0", "rule": {"action": "drop", "cm": "DREP"}}
    port = {"op": "port_up", "host": "a", "at": {"moment": "after", "ns": 5}}

    def marks(steps, p="roce"):
        return [st.get("may_miss", False) for st in swarm.mark_may_miss(steps, p)]

    assert marks([conn, verb, destroy]) == [False, False, False]
    assert marks([conn, verb, rule, destroy]) == [False, True, False, False]
    assert marks([conn, rule, verb, destroy]) == [False, False, True, False]
    assert marks([conn, verb]) == [False, True]                  # no destroy follows
    assert marks([conn, {"op": "disconnect", **C0}, dreq]) == [False, False, False]
    assert marks([conn, {"op": "disconnect", **C0}, dreq], "iwarp-siw") == [False] * 2 + [True]
    assert marks([conn, dreq]) == [False, True]                  # nothing sent a DREQ
    third = {**dreq, "at": {**dreq["at"], "n": 3}}               # only if earlier ones are lost
    assert marks([conn, {"op": "disconnect", **C0}, third]) == [False, False, True]
    assert marks([conn, state]) == [False, True]
    assert marks([conn, port]) == [False, False]
    # idempotent, and a mark no longer true is taken off
    assert swarm.mark_may_miss(swarm.mark_may_miss([conn, verb, destroy], "roce"), "roce") == \
        [conn, verb, destroy]
    assert marks([conn, {**verb, "may_miss": True}, destroy]) == [False, False, False]
    # every drawn schedule carries its marks
    for seed in range(1, 60):
        for st in swarm.draw(seed, "roce").steps:
            kind = (st.get("at") or {}).get("moment")
            assert kind != "cm_state" or st["may_miss"] is True
            assert kind != "after" or "may_miss" not in st


def test_the_shrinker_marks_a_drawn_candidate_anew():
    conn = {"op": "connect", "conn": "c0", "client": "a", "server": "b"}
    dreq = {"op": "destroy", "conn": "c0", "side": "client",
            "at": {"moment": "cm_msg", "msg": "DREQ", "n": 1}}
    drawn = sched([conn, {"op": "disconnect", **C0}, dreq], personality="roce",
                  meta={"knobs": {}})
    assert "may_miss" not in shrink.remark(drawn).steps[2]
    cut = drawn.with_steps([conn, dreq])   # the cut took the DREQ's cause away
    assert shrink.remark(cut).steps[1]["may_miss"] is True
    # a hand-written schedule keeps its marks as written
    assert shrink.remark(cut.__class__(hosts=["a", "b"], steps=[conn, dreq])).steps[1] == dreq
    # and a moment dropped takes may_miss with it
    assert shrink._no_moment({**dreq, "may_miss": True}) == {"op": "destroy", "conn": "c0",
                                                             "side": "client"}


def test_the_device_path_fails_a_missed_moment_and_writes_its_signature(tmp_path):
    """schedules/scenario.py (what `rdmalab replay --lab vm:...` and the device swarm run under
    pytest), here on a model lab: a moment that never comes fails the test, and the result
    file's signature says missed_moment with the step."""
    path = tmp_path / "never.json"
    sched([BASIC[0], {"op": "wait", "ns": 1000,
                      "at": {"moment": "cm_event", **C0, "event": "DISCONNECTED",
                             "within_ns": ms(1)}}], seed=3, settle_ns=0).dump(path)
    listing = tmp_path / "list.txt"
    listing.write_text(f"{path}\n")
    bindings = pathlib.Path(rdmalab.__file__).parents[1]
    env = {"PYTHONPATH": str(bindings), "PATH": "/usr/bin:/bin",
           "RDMALAB_SCHEDULES": str(listing), "RDMALAB_SCHEDULE_OUT": str(tmp_path / "out")}
    scenario = bindings / "rdmalab" / "schedules" / "scenario.py"
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "rdmalab.run.pytest_plugin", "-q",
                        "-p", "no:cacheprovider", str(scenario), "--lab", "model:roce"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 1 and "1 failed" in p.stdout, p.stdout + p.stderr
    got = json.loads((tmp_path / "out" / "model_roce" / "never.json").read_text())
    assert got["signature"] == ["missed_moment"]
    assert got["problems"] == ["missed_moment: step 1 (wait): moment cm_event DISCONNECTED "
                               "(conn c0 server) never came within 0.001 s"]


def test_a_moment_of_an_id_that_never_existed_fails_at_once():
    """Every REQ lost: the server never gets a CONNECT_REQUEST, so no DISCONNECTED can come to
    its id (it was taken at once, "approx", and the step ran)."""
    steps = [{"op": "rule", "name": "r0", "rule": {"action": "drop", "cm": "REQ"}}, BASIC[0],
             {"op": "wait", "ns": 1, "at": {"moment": "cm_event", **C0,
                                             "event": "DISCONNECTED"}}]
    for may in (False, True):
        steps[2]["may_miss"] = may
        with rdmalab.model_lab(seed=3, hosts=("a", "b"), personality="roce") as lab:
            out = Runner(lab, sched(steps), settle_ns=0).run()
        assert out.results[1]["detail"].startswith("no CONNECT_REQUEST")
        line = ("step 2 (wait): moment cm_event DISCONNECTED (conn c0 server) never came: "
                "conn c0 has no server cm_id (its connect failed)")
        assert out.missed == ([] if may else [line])
        assert out.results[2]["result"] == ("skipped" if may else "missed")
