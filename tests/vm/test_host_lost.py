"""A host lost mid-scenario is an outcome (issue 12 item 6), shown on VM guests reached as
inventory machines: tests/hostloss/scenario_host_lost.py runs in a pytest of its own with
`--lab inventory:PATH`; its first scenario powers host b's guest off from outside the lab
while waiting on b. The outcome must say which host was lost and when, keep b's records up to
then in the history and the JUnit file, and the next scenario must run on b, power-cycled
through the inventory's own power command. Nothing may hang.

RDMALAB_INVENTORY names an inventory already up (`python3 -m rdmalab.machines.vmlab up`, as make test-vm
does); without it the test boots two rxe guests itself."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time
import tomllib
import xml.etree.ElementTree as ET

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "tests" / "hostloss" / "scenario_host_lost.py"


def test_a_host_lost_mid_scenario_is_an_outcome_and_the_run_goes_on(inventory, tmp_path):
    hosts = tomllib.loads(inventory.read_text())["host"]
    junit, hist = tmp_path / "junit.xml", tmp_path / "history"
    env = dict(os.environ, RDMALAB_KILL_B=hosts[1]["power"]["off"],
               PYTHONPATH=os.pathsep.join([str(ROOT / "bindings"), str(ROOT)]))
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "rdmalab.run.pytest_plugin",
                        str(SCENARIO), "--lab", f"inventory:{inventory}", "-p", "no:cacheprovider",
                        "--history-dir", str(hist), "--junitxml", str(junit),
                        "--rdmalab-timeout", "240", "-q"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
                       stdin=subprocess.DEVNULL)
    took = time.monotonic() - t0
    out = r.stdout + r.stderr
    assert r.returncode == 1, out  # the lost host is a failed outcome; nothing else failed
    cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}
    lost = next(c for n, c in cases.items() if n.startswith("test_a_host_dies"))
    props = {p.get("name"): p.get("value") for p in lost.iter("property")}
    assert props["outcome"] == "host_lost", out
    failure = lost.find("failure")
    assert failure is not None and "host b (" in failure.get("message", ""), out
    assert "lost at t=" in failure.get("message", "")
    nxt = next(c for n, c in cases.items() if n.startswith("test_the_next_scenario"))
    assert nxt.find("failure") is None and nxt.find("error") is None and \
        nxt.find("skipped") is None, out
    # The history of the lost scenario: b's records up to the loss, the loss itself.
    [path] = [p for p in hist.iterdir() if "test_a_host_dies" in p.name]
    records = [json.loads(line) for line in path.read_text().splitlines()]
    kinds = [(r["host"], r["kind"]) for r in records]
    assert ("", "checkpoint") in kinds
    assert any(h == "b" and k == "cm_event" for h, k in kinds), kinds
    [loss] = [r for r in records if r["kind"] == "host_lost"]
    assert loss["host"] == "b" and loss["data"]["machine"] == hosts[1]["name"]
    checkpoint = next(r for r in records if r["kind"] == "checkpoint")
    assert loss["t_ns"] > checkpoint["t_ns"]
    # No wait ran to its deadline (the scenario waited up to 150 s on b).
    assert took < 400, f"the run took {took:.0f} s:\n{out}"


def test_inventory_guests_do_not_see_the_checkout(inventory):
    """What the scenarios ran on got everything over SSH: the checkout is empty in the
    guests (the agent they ran was shipped to /var/tmp/rdmalab-agent, rdmalab.machines.deploy)."""
    doc = tomllib.loads(inventory.read_text())
    for host in doc["host"]:
        s = host["ssh"]
        ssh = ["ssh", "-F", "/dev/null", "-i", s["identity"], "-p", str(s["port"]),
               "-o", f"HostKeyAlias={s['host_key_alias']}",
               "-o", f"UserKnownHostsFile={doc['lab']['known_hosts']}",
               "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR",
               f"{s['user']}@{s['address']}"]
        r = subprocess.run(ssh + [f"ls -A {ROOT}"],
                           capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "", f"{host['name']} sees the checkout: {r.stdout}"
