"""make test-ulp's table (rdmalab.run.ulp): each campaign's cell from its outcome and its
ulp_campaign record, rows by workload and fault, one column per device and kernel, and the
README block rewritten in place."""

import json
import textwrap

import pytest

from rdmalab.run import ulp
from rdmalab.run.inputs import BadInput


def case(name, outcome="", history="", message=""):
    props = {"column": "vm-rxe", "backend": "vm", "kernel": "6.1.0-56-amd64",
             "history": history}
    body = "".join(f'<property name="{k}" value="{v}"/>' for k, v in props.items())
    tail = f'<failure message="{message}">trace</failure>' if outcome == "failed" else ""
    return (f'<testcase classname="tests.ulp.test_ulp" name="{name}">'
            f"<properties>{body}</properties>{tail}</testcase>")


def write_run(d, cases, records):
    (d / "history").mkdir(parents=True)
    for fname, data in records.items():
        (d / "history" / fname).write_text(json.dumps(
            {"seq": 0, "t_ns": 0, "host": "", "object": "nvme", "kind": "ulp_campaign",
             "data": data}) + "\n")
    (d / "junit.xml").write_text("<testsuites><testsuite>" + "".join(cases)
                                 + "</testsuite></testsuites>")


def test_cells_say_recovery_teardown_errors_and_failures(tmp_path):
    rec = {"campaign": "target reboot", "moment": "", "recovery_s": 1.6, "teardown_s": 0.5,
           "io_errors": 0}
    drep = {"campaign": "every DREP dropped at disconnect", "moment": "disconnect",
            "recovery_s": 0, "teardown_s": 1.0, "io_errors": 0}
    gone = {"campaign": "initiator rdma link delete/add", "moment": "", "recovery_s": 0,
            "teardown_s": 0.4, "io_errors": 57}
    write_run(tmp_path / "rxe", [
        case("test_ulp_campaign[vm-rxe-target reboot-nvme]", history="history/a.jsonl"),
        case("test_ulp_campaign[vm-rxe-every DREP dropped at disconnect-nvme]",
             history="history/b.jsonl"),
        case("test_ulp_campaign[vm-rxe-initiator rdma link delete/add-nvme]",
             history="history/c.jsonl"),
        case("test_ulp_campaign[vm-rxe-target port down 10 s-iser]", "failed",
             message="rdmalab.errors.Hung: Hung: waited 60 s for session1 on b LOGGED_IN"),
    ], {"a.jsonl": rec, "b.jsonl": drep, "c.jsonl": gone})
    table = ulp.markdown(tmp_path).splitlines()
    assert table[0] == "| workload | fault | `vm-rxe@6.1.0-56` |"
    assert "| nvme | target reboot | live 1.6 s, teardown 0.5 s |" in table
    assert "| nvme | every DREP dropped at disconnect | teardown 1 s |" in table
    assert "| nvme | initiator rdma link delete/add | live 0 s, teardown 0.4 s, 57 I/O " \
           "errors |" in table
    assert "| iser | target port down 10 s | **FAILED**: Hung: waited 60 s for session1 on b " \
           "LOGGED_IN |" in table


def test_the_readme_block_is_rewritten_and_a_missing_one_named(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(textwrap.dedent("""\
        before
        <!-- ulp:begin -->
        old
        <!-- ulp:end -->
        after
        """))
    write_run(tmp_path / "out" / "rxe", [case("test_ulp_campaign[vm-rxe-partition-nvme]",
                                              history="history/a.jsonl")],
              {"a.jsonl": {"campaign": "partition", "recovery_s": 4.5, "teardown_s": 0.7}})
    assert ulp.main(["--table-only", "--out", str(tmp_path / "out"),
                     "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("before\n<!-- ulp:begin -->\n| workload |") and "old" not in text
    assert "| nvme | partition | live 4.5 s, teardown 0.7 s |" in text
    assert text.endswith("<!-- ulp:end -->\nafter\n")
    readme.write_text("no block\n")
    with pytest.raises(BadInput, match="no <!-- ulp:begin -->"):
        ulp.main(["--table-only", "--out", str(tmp_path / "out"), "--readme", str(readme)])


@pytest.mark.parametrize("scenario, row", [
    ("tests/ulp/test_ulp.py::test_ulp_campaign[partition 10 s-nfs]", ("partition 10 s", "nfs")),
    ("tests/ulp/test_seeds.py::test_nvme_target_torn_down_with_io_in_flight",
     ("target torn down with io in flight", "nvme")),
    ("tests/ulp/test_nfs.py::test_nfs_server_reboot_hard_mount[4.2]",
     ("server reboot hard mount (4.2)", "nfs"))])
def test_a_row_is_its_campaign_or_seed_scenario_and_workload(scenario, row):
    assert ulp._row(scenario) == row


def test_a_failure_then_its_teardown_error_is_one_cell_saying_the_failure(tmp_path):
    """pytest writes a test that failed and then errored in teardown as two testcases, the
    second without the lab's properties: one cell, the failure's, in the run's column."""
    run = tmp_path / "rxe"
    failed = case("test_ulp_campaign[vm-rxe-target reboot-nfs]", "failed",
                  message="Hung: rdma link delete rxe0 still blocks")
    error = ('<testcase classname="tests.ulp.test_ulp" name="test_ulp_campaign[vm-rxe-target '
             'reboot-nfs]"><error message="failed on teardown with Hung">t</error></testcase>')
    write_run(run, [failed, error], {})
    table = ulp.markdown(tmp_path)
    assert "| nfs | target reboot | **FAILED**: Hung: rdma link delete rxe0 still blocks |" \
        in table
    assert "teardown" not in table and "`-`" not in table


def test_a_campaign_that_passed_where_a_finding_was_marked_says_so(tmp_path):
    run = tmp_path / "rxe"
    xpass = case("test_ulp_campaign[target port down 10 s-srp]", "failed",
                 history="history/h.jsonl",
                 message="[XPASS(strict)] finding rxe-local-send-error-kills-qp1 on rxe")
    write_run(run, [xpass], {"h.jsonl": {"campaign": "target port down 10 s", "fault_s": 13.3,
                                         "recovery_s": 0.1, "teardown_s": 0.6, "io_errors": 0}})
    assert "| srp | target port down 10 s | **XPASS**: passed, the marked finding did not " \
        "reproduce (live 0.1 s, teardown 0.6 s) |" in ulp.markdown(tmp_path)
