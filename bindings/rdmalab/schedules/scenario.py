"""The scenario `rdmalab replay` and `rdmalab swarm --lab <device>` run through pytest: each
schedule listed in $RDMALAB_SCHEDULES on the lab the plugin gives, its checked outcome and
history written to $RDMALAB_SCHEDULE_OUT/<lab>/<schedule>.json. The test fails when a checker
says invalid (the device broke a rule the checkers state), when a wait hung (`bounded`), or when
a step's moment never came and the step did not say may_miss (`missed_moment`, naming the step
and the moment), not when it differs from the model: that comparison is the CLI's, after the
run. A schedule whose workload the lab refuses (no kernel ULPs) is a skip naming why.
"""
from __future__ import annotations

import json
import os
import re
import pathlib

import pytest

from rdmalab.schedules.schedule import Schedule
from rdmalab.schedules.swarm import check_run


def _schedules() -> list[pathlib.Path]:
    listing = os.environ.get("RDMALAB_SCHEDULES")
    if not listing:
        return []
    return [pathlib.Path(line) for line in pathlib.Path(listing).read_text().splitlines()
            if line.strip()]


@pytest.mark.parametrize("path", _schedules(), ids=lambda p: p.stem)
def test_schedule(lab, lab_spec, path):
    schedule = Schedule.load(path)
    r = check_run(lab, schedule, lab.description or "", keep_history=True)
    column = re.sub(r"[^A-Za-z0-9_.-]", "_", lab_spec.option)  # run.swarm_cli.column
    out = pathlib.Path(os.environ["RDMALAB_SCHEDULE_OUT"]) / column
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{path.stem}.json").write_text(json.dumps(
        {"schedule": str(path), "lab": column, "signature": list(r.signature),
         "problems": r.problems, "results": r.results, "history": r.history}) + "\n")
    refused = [x for x in r.results if x["op"] == "workload" and x["result"] == "unsupported"]
    if refused:  # a lab without what the workload needs (the model, one kernel's namespaces)
        pytest.skip(refused[0]["detail"])
    assert not r.failed, "\n".join(r.problems[:20])
