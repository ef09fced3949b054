"""XRC in fault schedules (seed 003): the xrc_* ops on the model, `unsupported` where the
device has no XRC, the xrc checker (rdmalab.checkers.xrc) on real and mutated histories, and
the swarm's XRC branch."""
import pytest

from rdmalab import checkers, ms
from rdmalab.checkers import xrc
from rdmalab.checkers.base import Context
from rdmalab.labs.engine import model_lab
from rdmalab.schedules import Runner, Schedule, ScheduleError, swarm

OPEN = {"op": "xrc_open", "xrc": "x0", "host": "b", "creator": "creator",
        "holders": ["worker"], "n_srq": 2}
CONNECT = {"op": "xrc_connect", "xrc": "x0", "sender": "s0", "host": "a", "process": "ini"}


def seed003(what="all"):
    """Traffic to the worker's SRQ, the creator killed, traffic again, the worker closes (its
    QP handle, or everything), one more send."""
    return [OPEN, CONNECT,
            {"op": "xrc_recv", "xrc": "x0", "srq": 0, "n": 8},
            {"op": "xrc_send", "sender": "s0", "srq": 0, "n": 2},
            {"op": "wait", "ns": ms(1)},
            {"op": "kill", "host": "b", "process": "creator"},
            {"op": "xrc_send", "sender": "s0", "srq": 0, "n": 2},
            {"op": "wait", "ns": ms(100)},
            {"op": "xrc_close", "xrc": "x0", "process": "worker", "what": what},
            {"op": "xrc_send", "sender": "s0", "srq": 0, "n": 1},
            {"op": "wait", "ns": ms(100)}]


def sched(steps, hosts=("a", "b")):
    return Schedule.from_json({"rdmalab_schedule": 1, "hosts": list(hosts), "seed": 3,
                               "steps": steps})


def run(personality, steps):
    lab = model_lab(seed=3, hosts=("a", "b"), personality=personality)
    with lab:
        out = Runner(lab, sched(steps)).run()
        return out, lab.history(), checkers.context_of(lab)


def sends(history):
    """The sender's completion statuses in order (its QP from the runner's bind)."""
    qpn = next(r["data"]["qp_num"] for r in history if r["kind"] == "schedule_bind"
               and r["data"].get("role") == "sender")
    return [r["data"]["status"] for r in history if r["kind"] == "wc" and r["host"] == "a"
            and r["data"]["qp_num"] == qpn]


@pytest.mark.parametrize("steps,needle", [
    ([CONNECT], "xrc 'x0' is not made by an earlier xrc_open"),
    ([OPEN, OPEN], "xrc 'x0' opened twice"),
    ([{**OPEN, "holders": ["creator"]}], "holders: distinct process names other than"),
    ([{**OPEN, "n_srq": 0}], "n_srq must be 1 to 8"),
    ([OPEN, {**CONNECT, "host": "b"}], "the sender's host is the xrc's host 'b'"),
    ([OPEN, CONNECT, {**CONNECT, "sender": "s1"}], "xrc 'x0' has a sender already"),
    ([OPEN, CONNECT, {"op": "xrc_send", "sender": "s0", "srq": 2}], "srq 2 out of range"),
    ([OPEN, {"op": "xrc_send", "sender": "s9", "srq": 0}], "sender 's9' is not made"),
    ([OPEN, {"op": "xrc_close", "xrc": "x0", "process": "other"}], "not xrc 'x0''s creator"),
    ([OPEN, {"op": "xrc_close", "xrc": "x0", "process": "worker", "what": "srq"}],
     "what 'srq': all, qp"),
])
def test_malformed_xrc_steps_name_the_step_and_field(steps, needle):
    with pytest.raises(ScheduleError) as e:
        sched(steps)
    assert needle in str(e.value)


def test_the_tgt_qp_outlives_its_killed_creator_on_ib():
    out, history, ctx = run("ib", seed003())
    assert [r["result"] for r in out.results] == ["ok"] * len(out.results), out.results
    # Before the kill and after it the sends complete; after the worker's last handle went
    # the TGT QP is gone (rule "handle") and the last send exhausts its retries.
    assert sends(history) == ["SUCCESS"] * 4 + ["RETRY_EXC_ERR"], sends(history)
    kinds = [r["kind"] for r in history]
    assert kinds.index("tgt_qp_destroyed") > kinds.index("schedule_release")
    verdicts = {r.checker: r for r in checkers.check_all(history, ctx)}
    assert verdicts["xrc"].verdict == "valid" and verdicts["xrc"].checked == 1
    assert verdicts["leftovers"].verdict == "valid", verdicts["leftovers"].problems
    assert all(r.verdict != "invalid" for r in verdicts.values())


def test_the_legacy_rule_keeps_the_tgt_qp_while_the_xrcd_is_held():
    out, history, ctx = run("ib-legacy", seed003(what="qp"))
    assert sends(history) == ["SUCCESS"] * 5, sends(history)
    assert all(r.verdict != "invalid" for r in checkers.check_all(history, ctx))


@pytest.mark.parametrize("personality", ["roce", "iwarp-siw", "mana"])
def test_a_device_without_xrc_gives_unsupported_results(personality):
    out, history, ctx = run(personality, seed003())
    results = {r["op"]: r["result"] for r in out.results}
    assert all(results[op] == "unsupported" for op in results if op.startswith("xrc_")), \
        out.results
    assert "has no XRC" in out.results[0]["detail"]
    assert out.error is None and out.hung is None
    assert all(r.verdict != "invalid" for r in checkers.check_all(history, ctx))


def _mutate(history, **changes):
    return [{**r, "data": {**r["data"], **changes}} if r["kind"] == "schedule_bind" and
            r["data"].get("role") in ("creator", "holder") else r for r in history]


def test_the_checker_fails_a_tgt_qp_that_died_while_a_holder_held_it():
    _, history, _ = run("ib", seed003())
    # Mutation: the TGT QP dies with its creator (the record moved right after the kill).
    dead = next(r for r in history if r["kind"] == "tgt_qp_destroyed")
    rest = [r for r in history if r is not dead]
    kill = next(i for i, r in enumerate(rest) if r["kind"] == "fault" and
                r["data"].get("fault") == "kill")
    mutated = rest[:kill + 1] + [dead] + rest[kill + 1:]
    res = xrc.check(mutated, Context(personality="ib"))
    assert res.verdict == "invalid"
    assert "worker still held a handle" in str(res.problems[0])
    assert dead["seq"] in res.problems[0].seqs


def test_the_checker_fails_a_send_that_found_no_tgt_qp_on_a_device_history():
    _, history, _ = run("ib", seed003())
    # As a device would show it: no tgt_qp_destroyed record, only the sender's completion;
    # mutated: the first send after the kill finds no responder.
    device = [r for r in history if r["kind"] != "tgt_qp_destroyed"]
    kill = next(r["seq"] for r in device if r["kind"] == "fault")
    wc = next(r for r in device if r["kind"] == "wc" and r["host"] == "a" and r["seq"] > kill)
    mutated = [{**r, "data": {**r["data"], "status": "RETRY_EXC_ERR"}} if r is wc else r
               for r in device]
    res = xrc.check(mutated, Context())
    assert res.verdict == "invalid", res
    assert "got RETRY_EXC_ERR" in str(res.problems[0])
    assert xrc.check(device, Context()).verdict == "valid"
    # A port down before it also exhausts retries: unknown, with the reason.
    port = {"seq": kill, "t_ns": 0, "host": "a", "object": "link", "kind": "fault",
            "data": {"fault": "port_down"}}
    at = next(i for i, r in enumerate(mutated) if r["seq"] == wc["seq"])
    faulted = mutated[:at] + [port] + mutated[at:]
    res = xrc.check(faulted, Context())
    assert res.verdict == "unknown" and "after a fault" in res.reason


def test_the_checker_judges_by_the_rule_the_history_names():
    # On ib (rule "handle") the worker's handle close ends the TGT QP though it keeps the
    # XRCD; a device following "xrcd" must keep it: the same history named "xrcd" is invalid.
    _, history, _ = run("ib", seed003(what="qp"))
    assert xrc.check(history, Context()).verdict == "valid"
    res = xrc.check(_mutate(history, tgt_lifetime="xrcd"), Context())
    assert res.verdict == "invalid" and "rule xrcd" in str(res.problems[0])


def test_the_swarm_draws_xrc_on_ib_only_and_leaves_other_draws_alone():
    drawn = [swarm.draw(seed, "ib") for seed in range(1, 41)]
    with_xrc = [s for s in drawn if s.meta.get("xrc")]
    assert 8 <= len(with_xrc) <= 32
    assert all(not swarm.draw(seed, "roce").meta.get("xrc") for seed in range(1, 41))
    def unmarked(steps):  # may_miss follows from the steps (an XRC kill makes a run unquiet)
        return [{k: v for k, v in st.items() if k != "may_miss"} for st in steps]

    for s in with_xrc:
        rest = unmarked(st for st in s.steps if not st["op"].startswith("xrc_"))
        base = unmarked(swarm.draw(s.seed, "roce").steps)  # the seed without the XRC branch
        assert all(st in rest for st in base)
    r = swarm.run_on_model(with_xrc[0], "ib")
    assert not r.failed, r.problems
