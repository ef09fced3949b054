"""Fault schedules as data: validation, files, the runner on the model, moments, the swarm's
draw and the shrinker."""
import json

import pytest

import rdmalab
from rdmalab import ms, sec
from rdmalab.schedule import Schedule, ScheduleError
from rdmalab.schedule_run import Runner
from rdmalab import shrink, swarm


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
