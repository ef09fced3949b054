"""The kernel log is an oracle (issue 16): a scenario during which a host's kernel logs a
WARNING fails, with the splat in its evidence, though the scenario itself did nothing wrong.
Shown on VM guests reached as inventory machines: tests/kernlog/scenario_warn.py runs through
`python3 -m rdmalab run --lab inventory:PATH`; its first scenario loads rdmalab_warn.ko (a test
module that WARNs on load, bindings/rdmalab/machines/vmlab/testmod) on host a; its second loads nothing and must
pass on the same hosts (the first one's splat is not carried over).

RDMALAB_INVENTORY names an inventory already up (`python3 -m rdmalab.machines.vmlab up`, as make test-vm-rxe
does); without it the test boots two rxe guests itself."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET

from rdmalab.report.junit import history_name

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "tests" / "kernlog" / "scenario_warn.py"
WARN_TEXT = "rdmalab_warn: a deliberate warning"  # the module's WARN message


def _stem(case: ET.Element) -> str:
    """The history/evidence name of a JUnit test case (classname tests.kernlog.scenario_warn)."""
    return history_name(f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}")


def _case(cases: dict, prefix: str, out: str) -> ET.Element:
    found = [c for n, c in cases.items() if n.startswith(prefix)]
    assert len(found) == 1, f"no single {prefix} in the JUnit file ({list(cases)}):\n{out}"
    return found[0]


def test_a_kernel_warning_fails_the_scenario_with_the_splat_as_evidence(inventory, tmp_path):
    hosts = tomllib.loads(inventory.read_text())["host"]
    out_dir = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "bindings"), str(ROOT)]))
    r = subprocess.run([sys.executable, "-m", "rdmalab", "run", "--lab", f"inventory:{inventory}",
                        "--out", str(out_dir), "--timeout", "240", str(SCENARIO)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
                       stdin=subprocess.DEVNULL)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out  # the warned scenario failed; nothing else did
    cases = {c.get("name"): c for c in ET.parse(out_dir / "junit.xml").getroot()
             .iter("testcase")}

    # The control, on the same hosts after the splat: passed.
    control = _case(cases, "test_the_next_scenario_without_the_module_passes", out)
    assert all(control.find(t) is None for t in ("failure", "error", "skipped")), out

    # The warned scenario failed, naming the host and the WARNING line: the oracle judges the
    # log when the lab closes, so pytest reports it as an error at teardown, the outcome
    # property as failed.
    warned = _case(cases, "test_a_kernel_warning_mid_scenario", out)
    failure = warned.find("failure")
    if failure is None:
        failure = warned.find("error")
    assert failure is not None, f"the scenario with a WARNING splat did not fail:\n{out}"
    message = failure.get("message", "") + "\n" + (failure.text or "")
    assert "WARNING:" in message and "rdmalab_warn" in message, message
    machine_a = hosts[0]["name"]
    assert "host a" in message or machine_a in message, \
        f"the failure names neither host a nor its machine {machine_a}:\n{message}"
    props = {p.get("name"): p.get("value") for p in warned.iter("property")}
    assert props.get("outcome") == "failed", props
    assert props.get("kernel_splat", "").startswith("WARNING:"), props
    assert "rdmalab_warn" in props["kernel_splat"], props

    # Its evidence: evidence/<stem>/ with the splat and the kernel log of host a.
    stem = _stem(warned)
    assert props.get("evidence") == f"evidence/{stem}", (props, stem)
    evidence = out_dir / "evidence" / stem
    splats = sorted(evidence.glob("splat-*.txt"))
    assert splats, f"no splat file in {evidence}: {sorted(p.name for p in evidence.iterdir())}"
    splat = splats[0].read_text()  # from the WARNING line (WARN's own message is before it)
    assert "WARNING:" in splat and "rdmalab_warn" in splat and "---[ end trace" in splat, splat
    kmsg = [p for p in evidence.glob("kmsg-*.txt") if WARN_TEXT in p.read_text()]
    assert kmsg, f"no kmsg file in {evidence} holds the warning"
    assert "WARNING:" in kmsg[0].read_text() and kmsg[0].name == "kmsg-a.txt", kmsg
    assert splats[0].name.startswith("splat-a-"), splats
    manifest = json.loads((evidence / "manifest.json").read_text())
    assert manifest["splats"] and splats[0].name in manifest["files"], manifest

    # The history has the splat as kernel_log records of host a; the control's has none.
    records = [json.loads(line) for line in
               (out_dir / "history" / f"{stem}.jsonl").read_text().splitlines()]
    klog = [rec for rec in records if rec["kind"] == "kernel_log"]
    assert any(rec["host"] == "a" and rec["data"]["text"].startswith("WARNING:")
               for rec in klog), klog
    control_stem = _stem(control)
    control_records = (out_dir / "history" / f"{control_stem}.jsonl").read_text()
    assert '"kernel_log"' not in control_records
    assert not list((out_dir / "evidence" / control_stem).glob("splat-*.txt"))
