"""report.html in a real browser: headless Chromium loads the report a real run wrote and the
test reads the page's DOM after the layout happened (the report's script puts it in
body[data-rendered]) against what the run wrote: one matrix cell per JUnit testcase, each ladder
with exactly one arrow per cm_send or wire record of its history file (counted here from the
JSONL, independently of the report's code), model and device ladders of one scenario side by
side; and a screenshot.

    RDMALAB_REPORT_DIR=out/vm-siw RDMALAB_SCREENSHOT=out/browser/report.png \\
        python3 -m pytest tests/browser

Without RDMALAB_REPORT_DIR the test makes its own run on the model (a few scenarios, seconds).
RDMALAB_SCREENSHOT defaults to <report dir>/report.png. Chromium: Debian's `chromium` package
(make test-browser installs it); the tests skip, naming it, where it is missing.
"""
from __future__ import annotations

import html.parser
import json
import os
import pathlib
import shutil
import signal
import struct
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
import zlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHROMIUM_TIMEOUT_S = 120   # one page load; a cold start on 2 busy cores takes seconds
RUN_TIMEOUT_S = 600
# The standalone run: scenarios with CM messages on both model twins, one skipped on each.
STANDALONE_LABS = ("model:roce", "model:iwarp-siw")
STANDALONE_K = "connect_and_disconnect or every_drep_dropped or close_with_every_fin_lost"
MESSAGE_KINDS = ("cm_send", "wire")   # the contract's arrow rule
OUTCOMES = {"passed", "failed", "error", "skipped", "finding", "provider-fact", "host_lost"}
DEVICE_PREFIXES = ("vm-", "netns-", "inventory")  # columns of device labs; the model's: model-
WINDOW = (1600, 2000)
# Our own measurement, run in a copy of the page after its load handler: where each ladder is.
GEOMETRY_SCRIPT = """<script>window.addEventListener('load', () => {
  const out = [];
  document.querySelectorAll('section.scenario').forEach(s =>
    s.querySelectorAll('figure.ladder').forEach(f => {
      const r = f.getBoundingClientRect();
      out.push({scenario: s.dataset.scenario, column: f.dataset.column,
                left: r.left, right: r.right, top: r.top, bottom: r.bottom});
    }));
  document.documentElement.dataset.testGeometry = JSON.stringify(out);
});</script>"""


# -- chromium

def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.skip("chromium is not installed (Debian package chromium; make test-browser "
                    "installs it)")
    return path


def stderr_tail(text: str, lines: int = 20) -> str:
    # Chromium logs D-Bus connection errors on every start in a container: noise, left out.
    kept = [l for l in text.splitlines() if "dbus/" not in l]
    return "\n".join(kept[-lines:]) or "(empty)"


def run_chromium(args: list[str], profile: pathlib.Path, what: str) -> str:
    """Chromium's stdout; fails with its exit status and stderr's tail, or when it outlives
    CHROMIUM_TIMEOUT_S (then its whole process group is killed: renderers, zygote)."""
    argv = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-extensions", "--hide-scrollbars", f"--user-data-dir={profile}", *args]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    t0 = time.monotonic()
    try:
        out, err = proc.communicate(timeout=CHROMIUM_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"chromium {what}: no answer within {CHROMIUM_TIMEOUT_S} s ({' '.join(argv)});"
                    f" stderr's tail:\n{stderr_tail(err)}")
    if proc.returncode != 0:
        pytest.fail(f"chromium {what}: exit status {proc.returncode} after "
                    f"{time.monotonic() - t0:.1f} s ({' '.join(argv)}); stderr's tail:\n"
                    f"{stderr_tail(err)}")
    return out


# -- the page's DOM, as --dump-dom serialises it (every non-void element closed)

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param",
        "source", "track", "wbr"}


class Node:
    def __init__(self, tag: str, attrs: dict, parent: "Node | None") -> None:
        self.tag, self.attrs, self.parent, self.children = tag, attrs, parent, []
        self.text = ""

    @property
    def classes(self) -> set[str]:
        return set((self.attrs.get("class") or "").split())

    def walk(self):
        for c in self.children:
            yield c
            yield from c.walk()

    def find(self, tag: str | None = None, cls: str | None = None) -> list["Node"]:
        return [n for n in self.walk()
                if (tag is None or n.tag == tag) and (cls is None or cls in n.classes)]

    def ancestor(self, tag: str, cls: str) -> "Node | None":
        n = self.parent
        while n is not None and not (n.tag == tag and cls in n.classes):
            n = n.parent
        return n


class DomParser(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {}, None)
        self.cur = self.root

    def handle_starttag(self, tag, attrs):
        node = Node(tag, {k: (v or "") for k, v in attrs}, self.cur)
        self.cur.children.append(node)
        if tag not in VOID:
            self.cur = node

    def handle_startendtag(self, tag, attrs):
        self.cur.children.append(Node(tag, {k: (v or "") for k, v in attrs}, self.cur))

    def handle_endtag(self, tag):
        n = self.cur
        while n is not None and n.tag != tag:
            n = n.parent
        if n is not None and n.parent is not None:  # an unmatched end tag is ignored
            self.cur = n.parent

    def handle_data(self, data):
        self.cur.text += data


def parse_dom(text: str) -> Node:
    p = DomParser()
    p.feed(text)
    p.close()
    return p.root


# -- what the run wrote

def read_history_messages(path: pathlib.Path) -> int:
    """Records of kind cm_send or wire in a history JSONL file."""
    n = 0
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            pytest.fail(f"{path}:{i}: not a JSON record: {e}")
        n += record.get("kind") in MESSAGE_KINDS
    return n


def junit_testcases(path: pathlib.Path) -> list[ET.Element]:
    try:
        return list(ET.parse(path).getroot().iter("testcase"))
    except (OSError, ET.ParseError) as e:
        pytest.fail(f"{path}: cannot read the run's JUnit XML: {e}")


def png_size_and_rows(path: pathlib.Path) -> tuple[int, int, int]:
    """(width, height, distinct scanlines) of a PNG: a flat page has one distinct scanline."""
    data = path.read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        pytest.fail(f"{path}: not a PNG file ({len(data)} bytes)")
    width, height = struct.unpack(">II", data[16:24])
    idat, pos = b"", 8
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = len(raw) // height
    rows = {raw[i * stride + 1:(i + 1) * stride] for i in range(height)}  # minus filter byte
    return width, height, len(rows)


# -- fixtures

@pytest.fixture(scope="module")
def report_dir(tmp_path_factory) -> pathlib.Path:
    given = os.environ.get("RDMALAB_REPORT_DIR")
    if given:
        d = pathlib.Path(given).resolve()
        if not (d / "report.html").is_file():
            pytest.fail(f"RDMALAB_REPORT_DIR={given}: no report.html there (python3 -m rdmalab "
                        f"run --out {given} writes it)")
        return d
    d = tmp_path_factory.mktemp("run")
    cmd = [sys.executable, "-m", "rdmalab", "run",
           *[x for lab in STANDALONE_LABS for x in ("--lab", lab)], "-k", STANDALONE_K,
           "--out", str(d)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT / "bindings"), str(ROOT), os.environ.get("PYTHONPATH")) if p))
    try:
        r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(cmd)}: still running after {RUN_TIMEOUT_S} s")
    if not (d / "report.html").is_file():
        pytest.fail(f"{' '.join(cmd)} (status {r.returncode}) wrote no {d / 'report.html'}; "
                    f"its output's tail:\n{(r.stdout + r.stderr)[-3000:]}")
    return d


@pytest.fixture(scope="module")
def profile(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("chromium-profile")


@pytest.fixture(scope="module")
def dom(report_dir, profile) -> Node:
    page = (report_dir / "report.html").as_uri()
    return parse_dom(run_chromium(["--dump-dom", page], profile, f"--dump-dom {page}"))


@pytest.fixture(scope="module")
def rendered(dom) -> dict:
    bodies = dom.find("body")
    assert bodies, "the dumped page has no <body>"
    raw = bodies[0].attrs.get("data-rendered")
    assert raw, ("body has no data-rendered after load: the report's script did not run, or "
                 "failed (the DOM contract: it sets document.body.dataset.rendered on load)")
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        pytest.fail(f"body[data-rendered] is not JSON ({e}): {raw[:300]}")


@pytest.fixture(scope="module")
def ladders(dom) -> list[Node]:
    return dom.find("figure", "ladder")


def place(fig: Node) -> tuple[str, str]:
    section = fig.ancestor("section", "scenario")
    assert section is not None, f"ladder {fig.attrs} is not inside a section.scenario"
    return section.attrs.get("data-scenario", ""), fig.attrs.get("data-column", "")


# -- tests

def test_the_page_loads_nothing_beside_itself(dom):
    # Self-contained: inline CSS/JS/SVG; a link (evidence) is fine, a load is not.
    loads = [f"<{n.tag} src={n.attrs['src']!r}>" for n in dom.walk()
             if n.tag in ("script", "img", "iframe", "embed", "object") and n.attrs.get("src")
             and not n.attrs["src"].startswith("data:")]
    loads += [f"<link href={n.attrs.get('href')!r}>" for n in dom.find("link")
              if "stylesheet" in n.attrs.get("rel", "")]
    assert not loads, f"report.html is meant to be self-contained, yet it loads {loads}"


def test_the_matrix_has_one_cell_per_junit_testcase(report_dir, dom, rendered):
    cases = junit_testcases(report_dir / "junit.xml")
    cells = dom.find("td", "cell")
    assert any(t.attrs.get("id") == "matrix" for t in dom.find("table")), \
        'report.html has no <table id="matrix">'
    n_cells, n_cases = len(cells), len(cases)
    assert n_cases > 0, f"{report_dir / 'junit.xml'} has no testcase"
    assert n_cells == n_cases, (f"{n_cells} td.cell for {n_cases} testcases in "
                                f"{report_dir / 'junit.xml'}")
    assert rendered.get("cells") == len(cases), (f"the page's script counted {rendered.get('cells')}"
                                                 f" cells, the JUnit has {len(cases)} testcases")
    outcomes = [c.attrs.get("data-outcome") for c in cells]
    assert set(outcomes) <= OUTCOMES, f"unknown data-outcome: {set(outcomes) - OUTCOMES}"
    bad_cases = sum(1 for c in cases if c.find("failure") is not None or c.find("error") is not None)
    host_lost = sum(1 for c in cases if any(p.get("name") == "outcome" and p.get("value") == "host_lost"
                                            for p in c.iter("property")))
    bad_cells = sum(1 for o in outcomes if o in ("failed", "error"))
    assert bad_cells == bad_cases - host_lost, (f"{bad_cells} cells failed/error, the JUnit has "
                                                f"{bad_cases - host_lost} failed or errored "
                                                f"testcases (host_lost apart)")
    for c in cells:  # a skip reason or failure message is one click away
        if c.attrs.get("data-outcome") in ("skipped", "failed", "error"):
            assert c.find("details"), f"cell {c.attrs} has no <details> with its reason"


def test_each_ladder_declares_and_holds_one_arrow_per_message_of_its_history(report_dir,
                                                                              ladders):
    assert ladders, "report.html has no figure.ladder"
    total = 0
    for fig in ladders:
        rel = fig.attrs.get("data-history", "")
        path = report_dir / rel
        assert rel and path.is_file(), f"ladder {place(fig)}: data-history {rel!r} is no file in {report_dir}"
        n = read_history_messages(path)
        total += n
        assert fig.attrs.get("data-messages") == str(n), (
            f"ladder {place(fig)}: data-messages={fig.attrs.get('data-messages')}, {rel} has {n} "
            f"cm_send/wire records")
        arrows = fig.find(cls="arrow")
        assert len(arrows) == n, f"ladder {place(fig)}: {len(arrows)} .arrow elements, {rel} has {n} messages"
        assert fig.find("svg"), f"ladder {place(fig)} has no <svg>"
    assert total > 0, "no ladder has a message: nothing was drawn to check"


def test_every_ladder_rendered_its_arrows_with_a_size(report_dir, ladders, rendered):
    # Grouped by (scenario, column), in document order: a column may have several histories.
    want: dict[tuple[str, str], list[int]] = {}
    for fig in ladders:
        want.setdefault(place(fig), []).append(read_history_messages(report_dir / fig.attrs["data-history"]))
    got: dict[tuple[str, str], list[int]] = {}
    for entry in rendered.get("ladders", []):
        got.setdefault((entry.get("scenario", ""), entry.get("column", "")), []).append(entry.get("arrows"))
    assert got == want, ("arrows with a size (getBBox) per ladder, as the page counted them after "
                         f"layout, against each history's cm_send+wire records:\n page: {got}\n"
                         f" history: {want}")


def test_every_history_of_the_run_has_a_ladder(report_dir, ladders):
    drawn = {fig.attrs.get("data-history") for fig in ladders}
    written = {p.relative_to(report_dir).as_posix()
               for p in (report_dir / "history").glob("*.jsonl")}
    assert written, f"the run wrote no history under {report_dir / 'history'}"
    assert written <= drawn, f"histories without a ladder: {sorted(written - drawn)}"


def test_model_and_device_ladders_of_a_scenario_side_by_side(report_dir, profile, ladders,
                                                            tmp_path):
    # Our own script in a copy of the page (self-contained, so the copy renders the same).
    page = (report_dir / "report.html").read_text()
    at = page.lower().rfind("</body>")
    copy = tmp_path / "report.html"
    copy.write_text((page[:at] + GEOMETRY_SCRIPT + page[at:]) if at >= 0 else page + GEOMETRY_SCRIPT)
    dom = parse_dom(run_chromium([f"--window-size={WINDOW[0]},{WINDOW[1]}", "--dump-dom",
                                  copy.as_uri()], profile, f"--dump-dom {copy.as_uri()} (geometry)"))
    raw = dom.find("html")[0].attrs.get("data-test-geometry")
    assert raw, "the geometry script did not run in the copy of the page"
    boxes: dict[str, list[dict]] = {}
    for b in json.loads(raw):
        boxes.setdefault(b["scenario"], []).append(b)

    def is_device(b):
        return b["column"].startswith(DEVICE_PREFIXES)

    pairs = [(m, d) for bs in boxes.values() for m in bs if not is_device(m)
             for d in bs if is_device(d)]
    kind = "model/device"
    if not pairs:  # a model-only run: any two ladders of one scenario
        pairs = [(a, b) for bs in boxes.values() for i, a in enumerate(bs) for b in bs[i + 1:]]
        kind = "two-column"
    if not pairs:
        pytest.skip("no scenario of this run has two ladders to compare")
    for a, b in pairs:
        apart = a["right"] <= b["left"] + 1 or b["right"] <= a["left"] + 1
        level = a["top"] < b["bottom"] and b["top"] < a["bottom"]
        assert apart and level, (f"{kind} ladders of {a['scenario']} are not side by side: "
                                 f"{a['column']} {a} / {b['column']} {b}")
        assert a["right"] > a["left"] and b["right"] > b["left"], f"a ladder has no width: {a} {b}"
    print(f"side by side: {len(pairs)} {kind} pairs of ladders")


def test_a_screenshot_of_the_report(report_dir, profile):
    shot = pathlib.Path(os.environ.get("RDMALAB_SCREENSHOT") or report_dir / "report.png")
    shot.parent.mkdir(parents=True, exist_ok=True)
    if shot.exists():
        shot.unlink()  # never pass on a previous run's picture
    page = (report_dir / "report.html").as_uri()
    run_chromium([f"--screenshot={shot}", f"--window-size={WINDOW[0]},{WINDOW[1]}", page],
                 profile, f"--screenshot {page}")
    assert shot.is_file(), f"chromium --screenshot wrote no {shot}"
    width, height, rows = png_size_and_rows(shot)
    assert (width, height) == WINDOW, f"{shot}: {width}x{height}, the window was {WINDOW}"
    assert rows > 10, f"{shot}: {rows} distinct rows of pixels: the page looks blank"
    print(f"screenshot: {shot}")
