"""OUT/report.html: the ladder layout of small synthetic histories (rdmalab.report.ladder), the page's
DOM contract (rdmalab.report.html), `report OUT` rebuilding it and clear errors for bad input."""

import html.parser
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from rdmalab.faults.records import from_switch
from rdmalab.report import html as html_report, ladder

BINDINGS = Path(__file__).resolve().parents[2] / "bindings"
S = 1_000_000_000


class History:
    """A synthetic history: add(kind, host, t_ns, object, **data) in order."""

    def __init__(self):
        self.records = []

    def add(self, kind, host, t_ns, obj="", **data):
        self.records.append({"seq": len(self.records), "t_ns": t_ns, "host": host,
                             "kind": kind, "object": obj, "data": data})
        return self.records[-1]

    def switch(self, t_ns, action, **fields):
        """The fault switch's log entry as an agent lab's history has it."""
        rec = from_switch({"seq": len(self.records), "t_ns": t_ns, "action": action, "rule": 1,
                           **fields}, 0)
        self.records.append(dict(rec, seq=len(self.records)))
        return self.records[-1]

    def cm(self, src, dst, t_ns, msg, attempt=1, received=True):
        self.add("cm_send", src, t_ns, "ib_cm:1", dst=dst, msg=msg, attempt=attempt,
                 local_comm_id=7, remote_comm_id=9)
        if received:
            self.add("cm_recv", dst, t_ns + 2000, "ib_cm", src=src, msg=msg, local_comm_id=7,
                     remote_comm_id=9)

    def event(self, host, t_ns, event, status=0, obj="cm_id:5"):
        self.add("cm_event", host, t_ns, obj, event=event, status=status)

    def wire(self, src, dst, t_ns, **frame):
        return self.add("wire", "switch", t_ns, "frame", src_host=src, dst_host=dst,
                        frame=dict({"proto": "roce"}, **frame))

    def write(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in self.records))


def model_connect(established_b="ESTABLISHED") -> History:
    h = History()
    h.add("lab_start", "", 0, "lab", hosts=2)
    h.event("a", 50_000, "ADDR_RESOLVED")
    h.cm("a", "b", 100_000, "REQ")
    h.event("b", 102_000, "CONNECT_REQUEST", obj="cm_id:10")
    h.cm("b", "a", 103_000, "REP")
    h.event("a", 106_000, "ESTABLISHED")
    h.cm("a", "b", 107_000, "RTU")
    h.event("b", 110_000, established_b, obj="cm_id:10")
    return h


def device_connect(established_b="ESTABLISHED") -> History:
    """The same outcomes as model_connect on a device: other ids, times and seqs."""
    h = History()
    h.add("lab_start", "", 150_000_000, "lab", lab="vm:rxe")
    h.add("verb", "a", 151_000_000, "cm_id:45", verb="rdma_create_id")
    h.event("a", 160_000_000, "ADDR_RESOLVED", obj="cm_id:45")
    h.wire("a", "b", 170_000_000, cm="REQ", opcode="SEND_ONLY", psn=1)
    h.event("b", 171_000_000, "CONNECT_REQUEST", obj="cm_id:37")
    h.wire("b", "a", 180_000_000, cm="REP", opcode="SEND_ONLY", psn=2)
    h.event("a", 181_000_000, "ESTABLISHED", obj="cm_id:45")
    h.wire("a", "b", 182_000_000, cm="RTU", opcode="SEND_ONLY", psn=3)
    h.event("b", 190_000_000, established_b, obj="cm_id:37")
    return h


# -- the layout

def test_one_arrow_per_cm_send_and_wire_record_and_lost_ones_stop_short():
    h = model_connect()
    h.cm("a", "b", 200_000, "DREQ")
    h.cm("b", "a", 210_000, "DREP", received=False)  # lost in the fabric
    h.add("fault", "b", 210_000, "fabric", fault="drop", src="b", dst="a", opcode="MAD")
    lad = ladder.layout(h.records)
    sends = [r for r in h.records if r["kind"] == "cm_send"]
    assert lad.messages == len(lad.arrows) == len(sends) == 5
    assert [a.label for a in lad.arrows] == ["REQ", "REP", "RTU", "DREQ", "DREP"]
    x = {lane.name: lane.x for lane in lad.lanes}
    assert [lane.name for lane in lad.lanes] == ["a", "b"]
    req, lost = lad.arrows[0], lad.arrows[-1]
    assert (req.x1, req.x2) == (x["a"], x["b"]) and req.y2 > req.y1
    assert "lost" in lost.classes and lost.x1 == x["b"] and x["a"] < lost.x2 < x["b"]
    fault = next(m for m in lad.marks if m.kind == "fault")
    assert x["a"] < fault.x < x["b"]  # drawn in the fabric, where it acted
    assert not any("arrow" in m.classes for m in lad.marks)


def test_wire_records_are_arrows_and_the_switch_drop_is_at_the_switch_lane():
    h = device_connect()
    h.add("wire_rule", "", 200_000_000, "switch", fault="drop",
          rule={"action": "drop", "cm": "DREP"})
    h.wire("a", "b", 210_000_000, cm="DREQ", opcode="SEND_ONLY", psn=4)
    dropped = h.wire("b", "a", 220_000_000, cm="DREP", opcode="SEND_ONLY", psn=5)
    h.switch(220_000_100, "drop", frame=dropped["data"]["frame"])
    h.wire("b", "", 230_000_000, proto="arp")  # broadcast: to the switch
    lad = ladder.layout(h.records)
    assert [lane.name for lane in lad.lanes] == ["a", "switch", "b"]
    x = {lane.name: lane.x for lane in lad.lanes}
    assert lad.messages == len(lad.arrows) == 6
    assert [a.label for a in lad.arrows] == ["REQ", "REP", "RTU", "DREQ", "DREP", "arp"]
    drep = lad.arrows[4]
    assert "dropped" in drep.classes and (drep.x1, drep.x2) == (x["b"], x["switch"])
    assert "dropped" not in lad.arrows[3].classes and lad.arrows[3].x2 == x["b"]
    assert "broadcast" in lad.arrows[5].classes and lad.arrows[5].x2 == x["switch"]
    drop = next(m for m in lad.marks if m.kind == "switch_drop")
    assert drop.x == x["switch"] and "fault" in drop.classes and drop.label == "drop DREP"
    rule = next(m for m in lad.marks if m.kind == "wire_rule")
    assert rule.x == x["switch"] and rule.label == "rule drop cm=DREP"
    assert ladder.frame_label({"proto": "roce", "opcode": "SEND_ONLY", "psn": 5}) == \
        "SEND_ONLY psn 5"
    # Of two sends of one frame the drop names the nearest; a summary with fewer fields
    # (the capture's decode beside the switch's rule record) still matches.
    h2 = History()
    h2.wire("a", "b", 1 * S, opcode="SEND_ONLY", psn=9, len=86)
    h2.wire("a", "b", 2 * S, opcode="SEND_ONLY", psn=9, len=86)
    h2.switch(2 * S + 50, "drop", frame={"proto": "roce", "opcode": "SEND_ONLY", "psn": 9})
    assert ["dropped" in a.classes for a in ladder.layout(h2.records).arrows] == [False, True]


def test_a_100_s_quiet_stretch_of_retries_becomes_one_labelled_gap():
    h = model_connect()
    h.cm("a", "b", 1_000_000, "DREQ")
    for attempt in range(2, 16):  # 14 retries, 6.5 s apart, nobody answers
        t = 1_000_000 + (attempt - 1) * 6_500_000_000
        h.add("cm_retry", "a", t, "ib_cm:1", msg="DREQ", attempt=attempt)
        h.cm("a", "b", t, "DREQ", attempt=attempt)
        h.add("cm_unexpected", "b", t + 2000, "ib_cm:2", msg="DREQ")
    h.event("a", 100 * S, "DISCONNECTED", status=-110)
    lad = ladder.layout(h.records)
    assert len(lad.arrows) == lad.messages == 18  # every retry still an arrow
    assert len(lad.gaps) == 1
    gap = lad.gaps[0]
    assert gap.label == "100.0 s: 14 DREQ retries"
    assert (gap.t0, gap.t1) == (1_000_000, 100 * S)  # from the first DREQ to the event
    inside_rows = 14 * 3  # each retry: its send, receipt and the peer's complaint
    assert gap.y2 - gap.y1 < inside_rows * ladder.ROW / 2  # compressed
    inside = [a for a in lad.arrows if a.quiet]
    assert len(inside) == 14 and all(gap.y1 < a.y1 < gap.y2 for a in inside)
    # An empty stretch is a gap too, and short ones are not.
    h2 = model_connect()
    h2.event("a", 3 * S, "DISCONNECTED")
    lad2 = ladder.layout(h2.records)
    assert [g.label for g in lad2.gaps] == ["3.0 s: quiet"]
    assert ladder.layout(model_connect().records).gaps == []


def test_first_difference_is_found_at_the_differing_outcome_and_absent_when_they_agree():
    model, device = model_connect(), device_connect()
    assert ladder.first_difference(model.records, device.records) is None  # ids normalised
    bad = device_connect(established_b="REJECTED")
    diff = ladder.first_difference(model.records, bad.records)
    assert diff is not None and diff.host == "b" and diff.index == 1
    assert model.records[diff.model_seq]["data"]["event"] == "ESTABLISHED"
    assert bad.records[diff.device_seq]["data"]["event"] == "REJECTED"
    assert "ESTABLISHED" in diff.describe() and "REJECTED" in diff.describe()
    # The device has one completion more on a: the model side has nothing there.
    model.add("wc", "a", 250_000_000, "qp:5", opcode="SEND", status="SUCCESS", wr_id=1)
    more = device_connect()
    more.add("wc", "a", 250_000_000, "qp:9", opcode="SEND", status="SUCCESS", wr_id=1)
    more.add("wc", "a", 300_000_000, "qp:9", opcode="SEND", status="WR_FLUSH_ERR", wr_id=2)
    diff = ladder.first_difference(model.records, more.records)
    assert diff.host == "a" and diff.model_seq is None and diff.index == 1
    assert more.records[diff.device_seq]["kind"] == "wc"
    assert diff.kind == "wc" and "wc #2" in diff.describe()
    # The highlight lands on that record's row, or at the end for the side with nothing.
    lad = ladder.layout(more.records, {diff.device_seq: "x"})
    mark = next(m for m in lad.marks if diff.device_seq in m.seqs)
    assert lad.highlights == [(mark.y, "x")]
    end = ladder.layout(model.records, {None: "x"})
    assert end.highlights[0][0] > max(m.y for m in end.marks)


def test_bulk_posts_and_completions_are_summarised():
    h = model_connect()
    for i in range(40):
        h.add("post", "a", 200_000 + i, "qp:9", opcode="SEND", queue="send", wr_id=i)
        h.add("wc", "b", 200_500 + i, "qp:13", opcode="RECV", status="SUCCESS", wr_id=i)
    lad = ladder.layout(h.records)
    bulk = [m for m in lad.marks if m.kind in ("post", "wc")]
    assert [m.label for m in bulk] == ["post SEND ×40", "wc RECV ok ×40"]
    assert len(bulk[0].seqs) == 40
    # A retry loop on a device: every frame stays an arrow, the switch's drops one mark.
    d = device_connect()
    for i in range(30):
        frame = d.wire("b", "a", 200_000_000 + i * 10_000_000, opcode="ACKNOWLEDGE",
                       psn=257)["data"]["frame"]
        d.switch(200_000_100 + i * 10_000_000, "drop", frame=frame)
    lad = ladder.layout(d.records)
    assert len(lad.arrows) == lad.messages == 33
    assert all("dropped" in a.classes for a in lad.arrows[3:])
    drops = [m for m in lad.marks if m.kind == "switch_drop"]
    assert [(m.label, len(m.seqs)) for m in drops] == [("drop ACKNOWLEDGE ×30", 30)]


def test_read_history_names_the_file_and_line(tmp_path):
    path = tmp_path / "h.jsonl"
    path.write_text('{"seq": 0, "t_ns": 0, "kind": "x", "data": {}}\n{"seq": 1,\n')
    try:
        ladder.read_history(str(path), "history/h.jsonl")
    except ladder.HistoryError as e:
        assert str(e).startswith("history/h.jsonl line 2: not JSON")
    else:
        raise AssertionError("a truncated line was accepted")
    path.write_text('{"seq": 0, "kind": "x"}\n')
    try:
        ladder.read_history(str(path), "h.jsonl")
    except ladder.HistoryError as e:
        assert str(e) == "h.jsonl line 1: record without t_ns"
    else:
        raise AssertionError("a record without t_ns was accepted")


# -- the page

def junit_case(name, column, backend, provider, body="", **props):
    props = dict({"backend": backend, "personality": provider, "column": column,
                  "provider": provider, "device": f"{provider}0", "seed": "1"}, **props)
    prop_xml = "".join(f'<property name="{k}" value="{v}"/>' for k, v in props.items())
    return (f'<testcase classname="tests.scenarios.test_x" name="{name}[{column}]">'
            f"<properties>{prop_xml}</properties>{body}</testcase>")


def write_run(out: Path, history_property=False) -> None:
    """A run with model-roce and vm-rxe columns: test_conn agrees, test_rej differs."""
    cases = [
        junit_case("test_conn", "model-roce", "model", "roce"),
        junit_case("test_conn", "vm-rxe", "vm", "rxe", kernel="6.1.0-1-amd64"),
        junit_case("test_rej", "model-roce", "model", "roce", provider_fact="fact-1"),
        junit_case("test_rej", "vm-rxe", "vm", "rxe",
                 '<failure message="assert REJECTED == ESTABLISHED">long text</failure>',
                 kernel="6.1.0-1-amd64"),
        junit_case("test_skip", "model-roce", "model", "roce",
                 '<skipped type="pytest.skip" message="requires xrc"/>'),
        junit_case("test_skip", "vm-rxe", "vm", "rxe",
                 '<skipped type="pytest.xfail" message="finding f1 on rxe"/>',
                 kernel="6.1.0-1-amd64", finding="f1"),
    ]
    if history_property:
        cases = [c.replace("<properties>", '<properties><property name="history" '
                           'value="history/custom.jsonl"/>', 1) if "test_conn[model" in c else c
                 for c in cases]
    out.mkdir(parents=True, exist_ok=True)
    (out / "junit.xml").write_text("<testsuites><testsuite>" + "".join(cases)
                                   + "</testsuite></testsuites>")
    hist = out / "history"
    model_connect().write(hist / ("custom.jsonl" if history_property else
                                  "tests.scenarios.test_x.test_conn-model-roce.jsonl"))
    device_connect().write(hist / "tests.scenarios.test_x.test_conn-vm-rxe.jsonl")
    model_connect().write(hist / "tests.scenarios.test_x.test_rej-model-roce.jsonl")
    rej = device_connect(established_b="REJECTED")
    rej.switch(195_000_000, "drop", frame={"proto": "roce", "cm": "DREQ"})
    rej.write(hist / "tests.scenarios.test_x.test_rej-vm-rxe.jsonl")
    evidence = out / "evidence" / "tests.scenarios.test_x.test_rej-vm-rxe"
    evidence.mkdir(parents=True)
    (evidence / "wire.pcap").write_bytes(b"")


class Dom(html.parser.HTMLParser):
    """Elements as (tag, attrs, [ancestor tags+attrs]); text under each svg <text>."""

    VOID = {"meta", "br", "line", "circle", "rect", "path", "input", "img", "link"}

    def __init__(self):
        super().__init__()
        self.elements, self.stack, self.texts = [], [], []

    def handle_starttag(self, tag, attrs):
        el = (tag, dict(attrs), list(self.stack))
        self.elements.append(el)
        if tag not in self.VOID:
            self.stack.append(el)

    def handle_startendtag(self, tag, attrs):
        self.elements.append((tag, dict(attrs), list(self.stack)))

    def handle_endtag(self, tag):
        while self.stack:
            if self.stack.pop()[0] == tag:
                break

    def handle_data(self, data):
        if self.stack:
            self.texts.append((self.stack[-1], data))

    def having(self, cls, tag=None):
        return [e for e in self.elements if cls in e[1].get("class", "").split()
                and (tag is None or e[0] == tag)]

    def inside(self, outer, cls):
        return [e for e in self.having(cls) if any(a is outer for a in e[2])]


def parse(path: Path) -> Dom:
    dom = Dom()
    dom.feed(path.read_text())
    return dom


def test_page_keeps_the_dom_contract(tmp_path):
    out = tmp_path / "out"
    write_run(out)
    path, problems = html_report.write(out)
    assert path == out / "report.html" and problems == []
    text = path.read_text()
    assert not re.search(r'(src|href)="(https?:)?//', text)  # nothing fetched
    dom = parse(path)
    cells = dom.having("cell", "td")
    got = {(c[1]["data-scenario"], c[1]["data-column"]): c[1]["data-outcome"] for c in cells}
    col = "vm-rxe@6.1.0-1"
    assert got == {("test_x::test_conn", "model-roce"): "passed",
                   ("test_x::test_conn", col): "passed",
                   ("test_x::test_rej", "model-roce"): "provider-fact",
                   ("test_x::test_rej", col): "failed",
                   ("test_x::test_skip", "model-roce"): "skipped",
                   ("test_x::test_skip", col): "finding"}
    assert all(dom.elements[dom.elements.index(c) + 1][0] == "details" for c in cells)
    assert "assert REJECTED == ESTABLISHED" in text and "requires xrc" in text
    assert len(dom.having("scenario", "section")) == 3
    figures = dom.having("ladder", "figure")
    assert [(f[1]["data-column"], f[1]["data-history"]) for f in figures][:2] == [
        ("model-roce", "history/tests.scenarios.test_x.test_conn-model-roce.jsonl"),
        (col, "history/tests.scenarios.test_x.test_conn-vm-rxe.jsonl")]
    assert len(figures) == 4  # test_skip has no history
    for fig in figures:
        arrows = dom.inside(fig, "arrow")
        assert int(fig[1]["data-messages"]) == len(arrows) == 3
        assert all(a[0] == "g" for a in arrows)
    # test_conn agrees: no first difference; test_rej: one in each of its two ladders.
    marked = [f for f in figures if dom.inside(f, "first-difference")]
    assert [(f[1]["data-history"].split(".")[-2]) for f in marked] == \
        ["test_rej-model-roce", "test_rej-vm-rxe"]
    assert all(len(dom.inside(f, "first-difference")) == 1 for f in marked)
    links = dom.having("evidence", "a")
    assert [a[1]["href"] for a in links] == \
        ["evidence/tests.scenarios.test_x.test_rej-vm-rxe/wire.pcap"]
    assert "document.body.dataset.rendered" in text


def test_history_property_is_followed_and_gaps_render(tmp_path):
    out = tmp_path / "out"
    write_run(out, history_property=True)
    slow = model_connect()
    slow.event("a", 30 * S, "DISCONNECTED")
    slow.write(out / "history" / "custom.jsonl")
    path, _ = html_report.write(out)
    dom = parse(path)
    fig = next(f for f in dom.having("ladder", "figure")
               if f[1]["data-history"] == "history/custom.jsonl")
    gaps = dom.inside(fig, "gap")
    assert len(gaps) == 1
    assert any(el is gaps[0] or any(a is gaps[0] for a in el[2]) for el, data in dom.texts
               if data == "30.0 s: quiet")


# -- the command line

def rdmalab_cli(*args, cwd):
    env = {"PYTHONPATH": str(BINDINGS), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "rdmalab", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_report_rebuilds_the_page_from_a_directory_or_its_junit(tmp_path):
    out = tmp_path / "out"
    write_run(out)
    r = rdmalab_cli("report", str(out), cwd=tmp_path)
    assert r.returncode == 1, r.stderr  # test_rej failed
    assert r.stdout.rstrip().endswith(f"report: {out / 'report.html'}")
    assert "test_x::test_conn" in r.stdout  # the table as before
    first = (out / "report.html").read_text()
    (out / "report.html").unlink()
    r = rdmalab_cli("report", str(out / "junit.xml"), cwd=tmp_path)
    assert r.returncode == 1 and (out / "report.html").read_text() == first


def test_report_names_a_missing_or_malformed_file_without_a_traceback(tmp_path):
    r = rdmalab_cli("report", str(tmp_path / "nowhere"), cwd=tmp_path)
    assert r.returncode == 2
    assert f"{tmp_path / 'nowhere'}: no such file" in r.stderr and "Traceback" not in r.stderr
    out = tmp_path / "out"
    write_run(out)
    (out / "junit.xml").write_text("<testsuites><testcase")
    r = rdmalab_cli("report", str(out), cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"{out / 'junit.xml'}: not a JUnit XML file" in r.stderr
    write_run(tmp_path / "out2")
    bad = tmp_path / "out2" / "history" / "tests.scenarios.test_x.test_rej-vm-rxe.jsonl"
    bad.write_text(bad.read_text() + '{"seq": 99, "t_ns"\n')
    r = rdmalab_cli("report", str(tmp_path / "out2"), cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = bad.read_text().count("\n")
    assert (f"history/tests.scenarios.test_x.test_rej-vm-rxe.jsonl line {lines}: not JSON"
            in r.stderr)
    page = (tmp_path / "out2" / "report.html").read_text()  # written all the same
    assert 'class="history-error"' in page and f"line {lines}: not JSON" in page


def test_run_writes_and_names_the_report(tmp_path):
    scen = tmp_path / "scen"
    scen.mkdir()
    (scen / "test_gen.py").write_text(textwrap.dedent("""
        def test_ok(lab):
            assert lab.host("a").caps().personality == "roce"
    """))
    out = tmp_path / "out"
    r = rdmalab_cli("run", "--lab", "model:roce", "--out", str(out), str(scen), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.rstrip().endswith(f"report: {out / 'report.html'}")
    dom = parse(out / "report.html")
    assert [c[1]["data-outcome"] for c in dom.having("cell", "td")] == ["passed"]
    figures = dom.having("ladder", "figure")
    assert len(figures) == 1 and (out / figures[0][1]["data-history"]).is_file()


def test_kinds_are_compared_apart_and_cm_events_only_where_both_sides_have_them():
    # Completions and CM events in another order between them: timing, not an outcome.
    model, device = model_connect(), device_connect()
    model.add("wc", "a", 1, "qp:9", opcode="SEND", status="SUCCESS", wr_id=1)  # before any event
    device.add("wc", "a", 400_000_000, "qp:3", opcode="SEND", status="SUCCESS", wr_id=1)
    assert ladder.first_difference(model.records, device.records) is None
    # A model lab that brought its QPs up without rdma_cm has no CM events: only the
    # completions are compared, and a differing one is still found.
    bare = History()
    bare.add("wc", "a", 1, "qp:9", opcode="SEND", status="SUCCESS", wr_id=1)
    assert ladder.first_difference(bare.records, device.records) is None
    flushed = History()
    flushed.add("wc", "a", 1, "qp:9", opcode="SEND", status="WR_FLUSH_ERR", wr_id=1)
    diff = ladder.first_difference(flushed.records, device.records)
    assert diff is not None and diff.kind == "wc" and "WR_FLUSH_ERR" in diff.model_text
    # A kind one side does not record on a host is not compared (the model writes a CQE's
    # wc when it is made, a device when it is polled): no completions on the device here.
    assert ladder.first_difference(flushed.records, model_connect().records) is None


def test_a_drains_own_completions_are_not_outcomes_its_result_is():
    marker, counting = model_connect(), device_connect()
    for h, qp in ((marker, "qp:5"), (counting, "qp:9")):
        h.add("wc", "a", 200_000_000, qp, opcode="SEND", status="SUCCESS", wr_id=1)
        h.add("drain_begin", "a", 210_000_000, qp, outstanding_sq=0, outstanding_rq=0)
    # The marker method's own completion; the counting method polls without recording.
    marker.add("wc", "a", 211_000_000, "qp:5", opcode="RDMA_WRITE", status="WR_FLUSH_ERR",
               wr_id=2)
    marker.add("drain_end", "a", 212_000_000, "qp:5", complete=True, method="marker")
    counting.add("drain_end", "a", 212_000_000, "qp:9", complete=True, method="counting")
    assert ladder.first_difference(marker.records, counting.records) is None
    hung = device_connect()
    hung.add("wc", "a", 200_000_000, "qp:9", opcode="SEND", status="SUCCESS", wr_id=1)
    hung.add("drain_end", "a", 212_000_000, "qp:9", complete=False, method="counting")
    diff = ladder.first_difference(marker.records, hung.records)
    assert diff is not None and diff.kind == "drain_end" and "INCOMPLETE" in diff.device_text
