"""A workload's records on the ladder (rdmalab.report.ladder): its steps, unit states, I/O
errors and resumptions and read-back are marks on their host's lane in the workload style (a
failure in the fault style), I/O progress is not drawn, a quiet stretch never swallows them, and
the page draws them as diamonds. The history is the NVMe-oF campaign's on vm:rxe (a target
reboot with its DREPs dropped), trimmed to its workload records and a few frames."""

import json
from pathlib import Path

from rdmalab.report import html as html_report, ladder
from rdmalab.report.ladder import labels
from rdmalab.workloads import records

NVME_HISTORY = Path(__file__).resolve().parent / "nvme_history.jsonl"
S = 1_000_000_000


def nvme_records() -> list[dict]:
    return [json.loads(line) for line in NVME_HISTORY.read_text().splitlines()]


def rec(seq, kind, host, t_ns, obj="nvme", **data):
    return {"seq": seq, "t_ns": t_ns, "host": host, "kind": kind, "object": obj, "data": data}


def workload_marks(lad) -> list:
    return [m for m in lad.marks if m.kind in records.KINDS]


def test_the_ladder_names_the_kinds_of_the_workloads_room():
    assert set(labels.WORKLOAD_LABELS) == set(records.KINDS)


def test_a_campaign_draws_its_steps_states_and_read_back_on_their_hosts_lanes():
    recs = nvme_records()
    lad = ladder.layout(recs)
    x = {lane.name: lane.x for lane in lad.lanes}
    assert [lane.name for lane in lad.lanes] == ["a", "switch", "b"]
    marks = workload_marks(lad)
    assert [m.label for m in marks] == [
        "target_up 1.3 s", "nvme0 live", "connect 1.7 s", "io_start",
        "nvme0 live→resetting", "nvme0 resetting→connecting", "target_up 1.1 s",
        "nvme0 connecting→live", "io_stop 660 written", "verify 381 acked, 0 lost",
        "nvme0 live→deleting (no IO)", "nvme0 deleting (no IO)→gone", "disconnect 365 ms",
        "target_down 22 ms"]
    assert all(m.classes == "mark workload" and m.x == x[m.host] for m in marks)
    assert {m.host for m in marks if m.label.startswith("target_")} == {"a"}
    # The I/O's once-a-second progress has no row; the arrows are still one per wire record.
    progress = [r["seq"] for r in recs if r["kind"] == records.IO]
    assert progress and not {s for m in lad.marks for s in m.seqs} & set(progress)
    assert lad.messages == len(lad.arrows) == sum(1 for r in recs if r["kind"] == "wire")
    # The 20 s the target was down are compressed; no workload mark is inside.
    assert lad.gaps and not any(m.quiet for m in marks)
    assert all(not g.y1 < m.y < g.y2 for g in lad.gaps for m in marks)


def test_failures_io_errors_and_lost_blocks_are_drawn_in_the_fault_style():
    recs = [
        rec(0, records.WORKLOAD, "b", 1 * S, step="connect", ok=False, took_ns=3 * S,
            error="nvme connect: Connection refused", errno=111),
        rec(1, records.WORKLOAD, "b", 2 * S, step="connect", ok=False, took_ns=S,
            error="nvme connect: timed out", errno=0),
        rec(2, records.IO, "b", 3 * S, op="write", phase="errors", ok=40, errors=1,
            error="EIO: Input/output error"),
        rec(3, records.IO, "b", 4 * S, op="write", phase="progress", ok=0, errors=20),
        rec(4, records.IO, "b", 5 * S, op="write", phase="resumed", ok=1, errors=37),
        rec(5, records.IO_VERIFY, "b", 6 * S, blocks=512, acked=300, matched=297, lost=[3, 9],
            lost_count=2, corrupt=[4], corrupt_count=1, pending=0),
        rec(6, records.WORKLOAD, "b", 7 * S, step="io_stop", ok=True, took_ns=0, written=5,
            errors=58, blocked=True, blocked_ns=S),
    ]
    lad = ladder.layout(recs)
    got = [(m.label, m.classes) for m in lad.marks]
    assert got == [
        ("connect failed: ECONNREFUSED", "mark workload fault"),
        ("connect failed: nvme connect: timed out", "mark workload fault"),
        ("write errors: EIO: Input/output error", "mark workload fault"),
        ("writes resumed after 37 errors", "mark workload"),
        ("verify 300 acked, 2 lost, 1 corrupt", "mark workload fault"),
        ("io_stop 5 written, 58 errors, a write blocked", "mark workload fault")]
    assert "\"lost_count\": 2" in lad.marks[4].title  # the hover keeps every field


def test_a_unit_state_inside_a_long_retry_stretch_splits_it_and_stays_labelled():
    recs, seq = [], 0

    def add(kind, host, t_ns, obj, **data):
        nonlocal seq
        recs.append(rec(seq, kind, host, t_ns, obj, **data))
        seq += 1
    add("cm_send", "a", 0, "ib_cm:1", dst="b", msg="DREQ", attempt=1)
    for attempt in range(2, 12):  # a DREQ retried every 2 s, nobody answers
        add("cm_send", "a", (attempt - 1) * 2 * S, "ib_cm:1", dst="b", msg="DREQ",
            attempt=attempt)
        if attempt == 6:
            add(records.ULP_STATE, "b", 10 * S + 1, "nvme", unit="nvme0", previous="live",
                state="resetting")
    lad = ladder.layout(recs)
    [mark] = workload_marks(lad)
    assert mark.label == "nvme0 live→resetting" and not mark.quiet
    assert [g.label for g in lad.gaps] == ["10.0 s: 5 DREQ retries"] * 2
    assert lad.gaps[0].y2 <= mark.y <= lad.gaps[1].y1
    without = [r for r in recs if r["kind"] != records.ULP_STATE]
    assert [g.label for g in ladder.layout(without).gaps] == ["20.0 s: 10 DREQ retries"]


def test_the_page_draws_workload_marks_as_diamonds(tmp_path):
    out = tmp_path / "out"
    hist = out / "history" / "tests.scenarios.test_nvme_of.test_reboot-vm-rxe.jsonl"
    hist.parent.mkdir(parents=True)
    hist.write_text(NVME_HISTORY.read_text())
    props = {"backend": "vm", "personality": "rxe", "column": "vm-rxe", "provider": "rxe",
             "device": "rxe0", "seed": "1", "kernel": "6.1.0-56-amd64"}
    prop_xml = "".join(f'<property name="{k}" value="{v}"/>' for k, v in props.items())
    (out / "junit.xml").write_text(
        '<testsuites><testsuite><testcase classname="tests.scenarios.test_nvme_of" '
        f'name="test_reboot[vm-rxe]"><properties>{prop_xml}</properties></testcase>'
        "</testsuite></testsuites>")
    path, problems = html_report.write(out)
    assert problems == []
    text = path.read_text()
    groups = text.split('<g class="mark workload')[1:]
    assert len(groups) == 14
    assert all(g.split("</g>")[0].count("<rect ") == 1 and "<circle" not in g.split("</g>")[0]
               for g in groups)
    assert ">verify 381 acked, 0 lost</text>" in text and "nvme0 live→resetting" in text
