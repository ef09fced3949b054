"""Scenarios for the kernel-log oracle's end-to-end check (tests/vm/test_kernel_oracle.py runs
them in a run of their own against an inventory of VM guests and reads the outcome): in the
first, host a's kernel logs a WARNING splat mid-scenario, from rdmalab_warn.ko (bindings/rdmalab/machines/vmlab/
testmod, built by `python3 -m rdmalab.machines.vmlab prepare`) shipped to the host over SSH and loaded
there, while the scenario itself does nothing wrong; the second, on the same hosts, loads
nothing. The oracle must fail the first with the splat in its evidence and pass the second.
A test aid, not a fault: not collected by the suite (the file name does not start with test_).
"""

import pytest

from rdmalab import sec
from rdmalab.api.resources import CmPair

REMOTE = "/var/tmp/rdmalab-testmod/rdmalab_warn.ko"


def _test_module(machine) -> str:
    """rdmalab_warn.ko built for the machine's running kernel (from the VM lab's cache, built
    there now if missing); skips where that kernel is not one the VM lab can build for."""
    from rdmalab.machines.vmlab import kernel  # the repository root is on sys.path under the plugin
    from rdmalab.machines.vmlab import prepare

    release = machine.run("uname -r", 30).check(f"{machine.name}: uname -r").out.strip()
    try:
        ko = prepare.ensure(release, siw=False, testmod=True).testmod_ko
    except kernel.KernelError as exc:
        pytest.skip(f"no rdmalab_warn.ko for {machine.name}'s kernel {release}: {exc}")
    assert ko is not None
    return str(ko)


def test_a_kernel_warning_mid_scenario(lab):
    machine_of = getattr(lab, "machine_of", None)
    if machine_of is None:
        pytest.skip("needs a device lab: the host's kernel logs the warning")
    a = machine_of("a")
    ko = _test_module(a)
    pair = CmPair(lab)
    a.copy_to(ko, REMOTE, timeout=60)
    # rmmod first: a previous run's copy may still be loaded; each load is one splat.
    a.run(f"rmmod rdmalab_warn 2>/dev/null; insmod {REMOTE}", 30, root=True) \
        .check(f"{a.name}: insmod {REMOTE}")
    lab.record("checkpoint", host="a", note="rdmalab_warn loaded: a WARNING splat logged")
    try:
        pair.client.conn.disconnect()
        pair.server.conn.wait("DISCONNECTED", sec(1) + lab.tolerance_ns)
    finally:
        a.run(f"rmmod rdmalab_warn; rm -f {REMOTE}", 30, root=True)


def test_the_next_scenario_without_the_module_passes(lab):
    pair = CmPair(lab)
    pair.client.conn.disconnect()
    pair.server.conn.wait("DISCONNECTED", sec(1) + lab.tolerance_ns)
