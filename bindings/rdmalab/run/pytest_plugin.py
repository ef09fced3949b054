"""pytest plugin: labs as fixtures, capability markers, seeds and replay, histories.

Load it with `-p rdmalab.run.pytest_plugin` or `pytest_plugins = ["rdmalab.run.pytest_plugin"]`.

Options (declared once, with their help, in rdmalab.run.options; `rdmalab run` takes them too):
  --lab SPEC           "model" (every model personality), "model:ib" or "model:ib,roce";
                       "vm" / "vm:rxe" / "vm:siw" / "vm:rxe,siw": the soft-RoCE VM lab;
                       "netns:rxe": hosts as network namespaces on one kernel (bindings/rdmalab/machines/netns.py);
                       "inventory:PATH": the machines of a TOML inventory; repeatable (--lab model:roce --lab vm:rxe: both, side by side)
                       Checked by rdmalab.run.inputs; an inventory is read and every host of it
                       reached once over ssh before any scenario: a bad --lab, file or host
                       is one usage error (exit status 4), never an error per scenario
  --vm-hosts N         hosts of the VM or netns lab (default 2)
  --kernel K           the guests' kernel: bookworm (default), trixie, sid or a Debian release
  --seed N             seed of every lab (default 1); failures print how to replay
  --history-dir DIR    one JSON-lines history per lab, named after the test id
  --evidence-dir DIR   an evidence bundle per scenario on a device lab (rdmalab.report.evidence:
                       capture, rdma res, kernel logs, splats); default: `evidence` beside
                       --history-dir when that is given, else a temporary directory
                       (removed when the session passes, printed when it does not)
  --rdmalab-timeout S  wall-clock safety net per test (default 300 s; 0 = off)
  --metrics-listen HOST:PORT, --metrics-push URL: Prometheus metrics (rdmalab.run.metrics_pytest)

Fixtures: lab_spec / personality (parametrized from --lab, ids like "model-ib"), lab (hosts "a"
and "b"), hosts (their Host objects, in order), lab_factory (labs with other hosts or fabric
options, same personality and seed), rdmalab_seed.
Markers: @pytest.mark.requires("xrc", "srq", "ud", transport="iWARP", event="QP_FATAL"):
skip, naming what the device lacks, when it lacks it. @pytest.mark.finding("<id>"): an entry of
the findings registry (rdmalab/findings/findings.toml): on its providers a finding or unclassified
divergence is a strict xfail, a provider fact is recorded on the passing cell (JUnit property
provider_fact). The terminal summary compares each device column with the model column of its
personality (rdmalab.findings.agreement).

Kernel logs are an oracle on every device lab: a splat (WARNING, BUG, Oops, KASAN,
UBSAN, RCU stall, hung task: rdmalab.findings.kernlog) in a host's kernel log during a scenario, its
lab's shutdown included, fails it (teardown; outcome "failed"), unless a findings-registry entry
expects it on that driver and kernel (its kernel_log regexes). JUnit properties: history (paths
relative to the run's directory), evidence (the bundle's directory), kernel_splat (the first
splat's first line), kernel_splat_expected (the entry that expected it).

This module is the entry point and the session: the options (rdmalab.run.options), the run's
settings, the machine pools' life. Its rooms: labspec (the columns), pools, session (settings, stash keys), fixtures,
histories (what a test's labs leave), markers, outcome (a test's outcome and row), summary,
wallclock (the safety net).
"""

from __future__ import annotations

import os
from typing import Optional

import pytest

from .. import progress
from . import metrics_pytest, options, pools
from .labspec import check_inventories, parse_lab_options
from .session import SETTINGS, Settings, spec_of

# The plugin's rooms with hooks, registered by pytest with this module. This module imports
# none of them: pytest imports each first, so that it can rewrite it.
pytest_plugins = ["rdmalab.run.fixtures", "rdmalab.run.markers", "rdmalab.run.outcome",
                  "rdmalab.run.summary", "rdmalab.run.wallclock"]


def pytest_addoption(parser):
    group = parser.getgroup("rdmalab")
    options.add_to_pytest(group)


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "requires(*features, transport=None, event=None): run only where the device has the "
        "features (xrc, srq, ud), one of the transports (IB, RoCE, iWARP) and raises the async "
        "event(s); skip naming what is missing otherwise")
    config.addinivalue_line(
        "markers",
        "finding(id): an entry of the findings registry (bindings/rdmalab/findings/findings.toml). On "
        "its providers (drivers, e.g. \"rxe\"; model personalities that copy it) a finding or "
        "unclassified divergence must fail with the entry's `raises` and is reported as the "
        "finding (strict xfail; passing there fails the run: update the entry); a provider "
        "fact must pass and is recorded (JUnit property provider_fact)")
    if config.getoption("kernel"):  # read by rdmalab.machines.vmlab.kernel wherever a guest boots
        os.environ["RDMALAB_VM_KERNEL"] = config.getoption("kernel")
    vm_hosts = config.getoption("vm_hosts")
    pools.set_hosts(vm_hosts)
    if vm_hosts < 1:
        raise pytest.UsageError(f"--vm-hosts {vm_hosts}: at least 1")
    specs = parse_lab_options(config.getoption("lab"))
    check_inventories(specs)
    config.stash[SETTINGS] = Settings(specs, config.getoption("seed"),
                                      config.getoption("history_dir"),
                                      config.getoption("rdmalab_timeout"),
                                      evidence_dir(config))
    metrics_pytest.configure(config, specs)
    progress.install_pytest_sink(config)  # long waits' progress lines, past pytest's capture


def evidence_dir(config) -> Optional[str]:
    """--evidence-dir, else `evidence` beside --history-dir, else None (no bundles)."""
    given = config.getoption("evidence_dir", None)
    if given:
        return given
    history = config.getoption("history_dir", None)
    if history:
        return os.path.join(os.path.dirname(os.path.abspath(history)), "evidence")
    return None


def pytest_sessionfinish(session):
    pools.close_pools()  # before the summary, which reports what they left on their hosts


def pytest_unconfigure(config):
    pools.close_pools()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    spec = spec_of(item)
    if spec is not None and spec.kind.pooled:
        # The caps the report's row names, probed before the scenario's lab: after its
        # column's last scenario the machine pool closes, and a probe at the row's
        # teardown would start the pool again (~40 s on TCG guests) just for that.
        try:
            spec.caps()
        except pytest.UsageError:
            pass  # the lab fixture says why the lab cannot start


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    pools.column_done(item, nextitem)
