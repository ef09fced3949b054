"""Workload steps in schedules (issue 29 item 3): their validation, the model's clean refusal,
the swarm's workload campaigns (`swarm --workload`), the shrinker keeping a campaign's frame, and
the CLI's refusals. No VM: the device run is shown in README ("The swarm")."""
import json
import pathlib
import subprocess
import sys

import pytest

import rdmalab
from rdmalab import sec
from rdmalab.run import swarm_cli
from rdmalab.schedules import Runner, Schedule, ScheduleError, shrink, workload_ops
from rdmalab.schedules.swarm import check_run
from rdmalab.schedules.swarm_workload import IB_CM, IW_CM, draw_workload
from rdmalab.schedules.workload_ops import KINDS, options_of
from rdmalab.labs.engine import model_lab

REPO = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "tests" / "swarm" / "schedules" / "rxe-nvme-target-reboot-drep-dropped.json"
W0 = {"op": "workload", "workload": "w0", "kind": "nvme", "target": "a", "initiator": "b",
      "options": {"backing": "disk", "ctrl_loss_tmo": 600}}
FRAME = ("workload", "workload_setup", "workload_start_io")
END = ("workload_stop_io", "workload_verify", "workload_teardown")


def sched(steps, hosts=("a", "b"), **kw):
    return Schedule.from_json({"rdmalab_schedule": 1, "hosts": list(hosts), "steps": steps,
                               **kw})


def w(op, **kw):
    return {"op": op, "workload": "w0", **kw}


@pytest.mark.parametrize("steps,needle", [
    ([{**W0, "kind": "iscsi"}], "step 0 (workload): kind 'iscsi' unknown; known: nvme"),
    ([{**W0, "target": "z"}], "step 0 (workload): target 'z' is not one of the schedule's"),
    ([{**W0, "initiator": "a"}], "step 0 (workload): target and initiator are both 'a'"),
    ([{k: v for k, v in W0.items() if k != "initiator"}], "field 'initiator' missing"),
    ([{**W0, "options": {"colour": 1}}],
     "step 0 (workload) options: unknown option(s) ['colour']; nvme takes nqn, port"),
    ([{**W0, "options": {"ctrl_loss_tmo": "600"}}],
     "options: ctrl_loss_tmo='600': int or null expected"),
    ([{**W0, "options": {"port": True}}], "options: port=True: int expected"),
    ([{**W0, "options": []}], "step 0 (workload): options=[]: dict expected"),
    ([W0, W0], "step 1 (workload): workload 'w0' declared twice"),
    ([w("workload_setup")], "step 0 (workload_setup): workload 'w0' is not declared by an "
                            "earlier workload step"),
    ([W0, w("workload_wait_state", state="alive")],
     "step 1 (workload_wait_state): state 'alive' is not a state of nvme; allowed: new, live"),
    ([W0, w("workload_wait_state")], "step 1 (workload_wait_state): field 'state' missing"),
    ([W0, w("workload_start_io", blocks=0)], "step 1 (workload_start_io): blocks must be >= 1"),
    ([W0, w("workload_teardown", deadline_ns=-1)], "deadline_ns must be >= 0"),
    ([W0, w("workload_verify", deadline_ns=5)], "step 1 (workload_verify): unknown field(s) "
                                                "['deadline_ns']"),
    ([{"op": "rdma_link_add", "host": "c"}], "step 0 (rdma_link_add): host 'c' is not one"),
])
def test_malformed_workload_steps_name_the_step_and_field(steps, needle):
    with pytest.raises(ScheduleError) as e:
        sched(steps)
    assert needle in str(e.value)


def test_a_kinds_options_are_its_constructors():
    """One home: a workload step's options are the keyword-only options of its class."""
    assert set(options_of("nvme")) == {"nqn", "port", "backing", "size_mb", "keep_alive_tmo",
                                       "reconnect_delay", "ctrl_loss_tmo", "fast_io_fail_tmo"}
    for name, kind in KINDS.items():
        assert kind.rules.live in kind.states
        assert not kind.rules.reconnect_delay or kind.rules.reconnect_delay in options_of(name)


def test_the_model_refuses_a_workload_schedule_cleanly():
    """Every step of the workload is `unsupported` with the lab's reason; the faults around
    them still run; nothing hangs, nothing is missed, every checker is valid."""
    s = Schedule.load(EXAMPLE)
    with model_lab(seed=1, hosts=("a", "b")) as lab:
        r = check_run(lab, s, "roce")
    by_op = {x["op"]: x for x in r.results}
    assert len(r.results) == len(s.steps) and not r.failed, r.problems
    for x in r.results:
        if x["op"].startswith("workload"):
            assert x["result"] == "unsupported" and "kernel_ulp" in x["detail"], x
    assert by_op["reboot"]["result"] == by_op["rule"]["result"] == "ok"


def test_replay_on_the_model_says_the_workload_is_refused(capsys):
    assert swarm_cli.replay_model(Schedule.load(EXAMPLE), "roce", []) == 0
    out = capsys.readouterr().out
    assert "model:roce: 12 steps" in out and "every checker valid" in out
    assert "8 workload step(s) unsupported: model:roce runs no kernel whose ULPs" in out


def test_the_device_path_skips_a_refused_workload_naming_why(tmp_path):
    """schedules/scenario.py (what `replay --lab vm:...` and `swarm --workload` run under
    pytest) on a model lab: a skip naming kernel_ulp, and the result file written."""
    listing = tmp_path / "list.txt"
    listing.write_text(f"{EXAMPLE}\n")
    bindings = pathlib.Path(rdmalab.__file__).parents[1]
    env = {"PYTHONPATH": str(bindings), "PATH": "/usr/bin:/bin",
           "RDMALAB_SCHEDULES": str(listing), "RDMALAB_SCHEDULE_OUT": str(tmp_path / "out")}
    scenario = bindings / "rdmalab" / "schedules" / "scenario.py"
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "rdmalab.run.pytest_plugin", "-q",
                        "-rs", "-p", "no:cacheprovider", str(scenario), "--lab", "model:roce"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "1 skipped" in p.stdout, p.stdout + p.stderr
    assert "capability kernel_ulp" in p.stdout
    got = json.loads((tmp_path / "out" / "model_roce" / f"{EXAMPLE.stem}.json").read_text())
    assert got["signature"] == [] and got["results"][0]["result"] == "unsupported"


@pytest.mark.parametrize("personality", ["roce", "iwarp-siw"])
def test_a_workload_campaign_is_framed_by_the_workload(personality):
    """Every drawn campaign: declared, set up and writing first; the working state waited for,
    the I/O stopped and read back and the teardown last; every rule taken out by then; the
    CM faults in the personality's own messages; the same seed the same schedule."""
    msgs = IB_CM if personality == "roce" else IW_CM
    kinds = set()
    for seed in range(1, 41):
        s = draw_workload(seed, "nvme", personality)
        s.validate()
        ops = [st["op"] for st in s.steps]
        assert tuple(ops[:3]) == FRAME and tuple(ops[-3:]) == END, ops
        assert ops[-5] == "workload_wait_state" and s.steps[-5]["state"] == "live"
        assert s.steps[0]["options"] == KINDS["nvme"].swarm_options
        rules = [st["name"] for st in s.steps if st["op"] == "rule"]
        assert sorted(rules) == sorted(st["name"] for st in s.steps if st["op"] == "unrule")
        faults = [st for st in s.steps[3:-5] if st["op"] in (
            "rule", "reboot", "port_down", "rdma_link_delete")]
        assert faults and all(st["at"]["moment"] == "after" for st in faults)
        for st in s.steps:
            key = {k: v for k, v in st.get("rule", {}).items()
                   if k in ("cm", "tcp_flags", "opcode")}
            assert not key or key in msgs, st
            if st["op"] == "reboot" and st["host"] == "b":   # the initiator's controller went
                assert "workload_connect" in ops[ops.index("reboot"):]
        kinds.update(op for op in ops if op not in FRAME + END)
        assert draw_workload(seed, "nvme", personality).to_json() == s.to_json()
    assert {"rule", "unrule", "reboot", "workload_export", "port_down", "port_up",
            "rdma_link_delete", "rdma_link_add", "workload_connect"} <= kinds


def test_the_shrinker_keeps_a_campaigns_frame():
    """A failure that needs only the initiator's reboot shrinks to the frame and the reboot:
    the set-up, I/O, wait, read-back and teardown are never cut."""
    s = next(d for seed in range(1, 200)
             if len((d := draw_workload(seed, "nvme", "roce")).steps) > 16 and any(
                 st["op"] == "reboot" and st["host"] == "b" for st in d.steps))

    def fails(c: Schedule) -> bool:
        return any(st["op"] == "reboot" and st["host"] == "b" for st in c.steps)

    small, _ = shrink.shrink(s, fails)
    want = [st["op"] for st in s.steps if st["op"] in shrink.FRAME_OPS or fails(
        s.with_steps([st]))]
    assert [st["op"] for st in small.steps] == want
    assert want[:3] == list(FRAME) and want[-3:] == list(END) and "reboot" in want
    assert all("at" not in st for st in small.steps)   # simplified: at once


def test_the_swarm_refuses_a_workload_on_the_model(tmp_path):
    env = {"PYTHONPATH": str(pathlib.Path(rdmalab.__file__).parents[1]), "PATH": "/usr/bin:/bin"}
    for args, needle in ((["--lab", "model:roce"], "the model runs no kernel ULPs"),
                         (["--lab", "vm:rxe", "--workload", "iscsi"], "invalid choice: 'iscsi'")):
        if "--workload" not in args:
            args = args + ["--workload", "nvme"]
        p = subprocess.run([sys.executable, "-m", "rdmalab", "swarm", *args, "--out",
                            str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 2 and needle in p.stderr, p.stdout + p.stderr
        assert "Traceback" not in p.stderr


def test_the_workload_swarm_prints_each_step_and_the_verdict(tmp_path, monkeypatch, capsys):
    """swarm_cli.swarm_workload with the device run replaced: the drawn files, each step's
    result, the failure's problems and its replay command, exit 1."""
    def run_devices(args, labs, paths, results, timeout_s=None):
        assert timeout_s == swarm_cli.WORKLOAD_TIMEOUT_S
        for path in paths:
            s = Schedule.load(path)
            out = results / swarm_cli.column(labs[0]) / f"{path.stem}.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            results_ = [{"i": i, "op": st["op"], "result": "ok", "detail": ""}
                        for i, st in enumerate(s.steps)]
            sig = ["workloads"] if s.seed == 2 else []
            out.write_text(json.dumps({"signature": sig, "results": results_,
                                       "problems": ["workloads: 3 acknowledged blocks lost"]
                                       if sig else []}))
        return 1

    monkeypatch.setattr(swarm_cli, "run_devices", run_devices)
    args = swarm_cli.parser("swarm").parse_args(["--lab", "vm:rxe", "--workload", "nvme",
                                                 "--seeds", "2", "--out", str(tmp_path)])
    swarm_cli.check_args("swarm", args)
    assert swarm_cli.swarm(args) == 1
    out = capsys.readouterr().out
    assert (tmp_path / "schedules" / "nvme-roce-1.json").exists()
    assert "vm:rxe nvme-roce-1.json: valid" in out and "vm:rxe nvme-roce-2.json: FAILED " \
        "workloads" in out
    assert "   0 workload ok" in out and "workloads: 3 acknowledged blocks lost" in out
    assert f"replay: python3 -m rdmalab replay {tmp_path}/schedules/nvme-roce-2.json --lab " \
        "vm:rxe" in out and "workload schedules: 2 schedule(s) x 1 lab(s), 1 failed" in out


def test_a_reboot_of_the_initiator_makes_the_workload_anew(monkeypatch):
    """The runner's bookkeeping without a kernel: a fake workload class stands in for NvmeOf.
    After the initiator's reboot the I/O is gone (stop_io is an error naming why), a connect
    and a new start_io bring it back; the runner's cleanup tears down what no step did."""
    made, calls = [], []
    answers = {"stop_io": {"written": 3, "errors": 0, "first_error": "", "blocked": False,
                           "blocked_ns": 0},
               "verify": {"acked": 3, "matched": 3, "lost_count": 0, "corrupt_count": 0,
                          "pending": 0},
               "wait_state": 1.5, "leftovers": {}}

    class Fake:
        def __init__(self, lab, target, initiator, **options):
            made.append(self)

        def __getattr__(self, name):
            def call(*args, **kw):
                calls.append(name)
                return answers.get(name)
            return call

    Fake.kind = "nvme"
    monkeypatch.setitem(workload_ops.KINDS, "nvme", workload_ops.Kind(Fake, KINDS["nvme"].states,
                                                                      {}))
    bare = {k: v for k, v in W0.items() if k != "options"}  # Fake takes no options
    s = sched([bare, w("workload_setup"), w("workload_start_io"),
               {"op": "reboot", "host": "b", "down_ns": sec(1)}, w("workload_stop_io"),
               w("workload_connect"), w("workload_start_io"),
               w("workload_wait_state", state="live"), w("workload_stop_io"),
               w("workload_verify")], settle_ns=0)
    with model_lab(seed=1, hosts=("a", "b")) as lab:
        r = Runner(lab, s).run()
    res = [(x["op"], x["result"], x.get("detail", "")) for x in r.results]
    assert res[4] == ("workload_stop_io", "error",
                      "workload w0: no I/O runs (the initiator b rebooted)"), res
    assert res[7] == ("workload_wait_state", "ok", "live after 1.5 s")
    assert res[8][1:] == ("ok", "3 written, 0 errors")
    assert res[9][1:] == ("ok", "3 acked, 3 matched, 0 lost, 0 corrupt, 0 pending")
    assert len(made) == 2 and calls[-1] == "teardown"   # the runner's cleanup
