"""Scenarios for the host-loss check (tests/vm/test_host_lost.py runs them in a pytest of their
own against an inventory and reads the outcome): host b's machine is powered off from outside
the lab, by nobody's fault verb, while the scenario waits on b. Not collected by the suite
(the file name does not start with test_)."""

import os
import subprocess
import threading

from rdmalab import sec
from rdmalab.api.resources import CmPair


def test_a_host_dies_mid_scenario(lab):
    pair = CmPair(lab)
    lab.record("checkpoint", note="connected, b about to die")
    kill = os.environ["RDMALAB_KILL_B"]  # b's machine's power-off command line
    threading.Timer(2.0, lambda: subprocess.run(kill, shell=True, check=False,
                                                stdout=subprocess.DEVNULL,
                                                stderr=subprocess.DEVNULL)).start()
    # Blocked in b's agent when b dies: the call must end at once, not at its deadline.
    pair.server.conn.wait("DISCONNECTED", sec(150))


def test_the_next_scenario_runs_on_the_restarted_host(lab):
    pair = CmPair(lab)
    pair.client.conn.disconnect()
    pair.server.conn.wait("DISCONNECTED", sec(1) + lab.tolerance_ns)
