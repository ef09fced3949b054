"""pytest plugin: labs as fixtures, capability markers, seeds and replay, histories.

Load it with `-p rdmalab.run.pytest_plugin` or `pytest_plugins = ["rdmalab.run.pytest_plugin"]`.

Options:
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
"""

from __future__ import annotations

import dataclasses
import faulthandler
import functools
import os
import shutil
import signal
import sys
import tempfile
import threading
from typing import Optional

import pytest

from .. import _core
from ..findings import agreement, registry as findings
from . import inputs, metrics_pytest
from .labkinds import LAB_KINDS, LabKind
from ..report import junit as report
from ..report.junit import history_name  # noqa: F401 (also imported from here)
from ..errors import FaultNotSupported, WallClockTimeout, raise_parked
from ..protocol import Lab
from ..names import parse
from ..api.verbs import DeviceCaps

DEFAULT_HOSTS = ("a", "b")
HARD_TIMEOUT_GRACE_S = 60  # after the soft timeout, faulthandler dumps stacks and exits
FEATURES = {"xrc": "XRC", "srq": "SRQ", "ud": "UD"}

_PHASES = pytest.StashKey[dict]()
_SETTINGS = pytest.StashKey["Settings"]()
_FAILURES = pytest.StashKey[list]()
_LABS = pytest.StashKey[list]()  # the labs a test's fixtures made
_ENTRY = pytest.StashKey[tuple]()  # (registry entry, lab key) of a @finding that applies here
_RESULTS = pytest.StashKey[list]()  # report.Result per test and column, for the agreement
_REGISTRY = pytest.StashKey[findings.Registry]()
# (property, id): a registry entry this lab's kernel has fixed, or is older than
_FIXED = pytest.StashKey[tuple]()
_EVIDENCE = pytest.StashKey[list]()  # evidence.Collector per lab of a test (None: a model lab)
_SPLATS = pytest.StashKey[list]()    # the kernel-log splats its labs' evidence found
_FILES = pytest.StashKey[dict]()     # {"history": [paths], "evidence": [dirs]} a test wrote


@dataclasses.dataclass(frozen=True)
class LabSpec:
    """One column of the result table: a kind of lab and what it runs on: a model
    personality ("model", "ib"), a VM lab device ("vm", "rxe"), an inventory file
    ("inventory", "lab.toml")."""
    backend: str
    personality: str

    @property
    def kind(self) -> LabKind:
        return LAB_KINDS[self.backend]

    @property
    def id(self) -> str:
        return f"{self.backend}-{self.kind.label(self.personality)}"

    @property
    def option(self) -> str:
        return f"{self.backend}:{self.personality}"

    def build(self, seed: int, hosts=DEFAULT_HOSTS, **options) -> Lab:
        """A lab of this spec (a host given as {name: {...}} may override the model's
        xrc_tgt_lifetime or personality; labs of real devices refuse model-only options)."""
        if self.kind.pooled:
            return agent_pool(self).lab(seed, list(hosts), **options)
        return self.kind.build(self.personality, seed, hosts, **options)

    def caps(self) -> DeviceCaps:
        return _caps_of(self)


def _caps_of(spec: LabSpec) -> DeviceCaps:
    try:
        return _probe_caps(spec)
    except (pytest.UsageError, KeyboardInterrupt):
        raise
    except Exception as e:  # a lab that cannot start: say why, no INTERNALERROR trace
        raise pytest.UsageError(f"--lab {spec.option}: the lab cannot start: "
                                f"{type(e).__name__}: {e}") from e


@functools.lru_cache(maxsize=None)
def _probe_caps(spec: LabSpec) -> DeviceCaps:
    with spec.build(seed=1, hosts=("probe",)) as lab:
        from ..agent.remote import obtain
        return obtain(lab.host("probe").caps())


PROBE_DEADLINE_S = 30.0  # reaching every inventory host once at the session's start
_POOLS: dict = {}
_VM_HOSTS = [2]


def agent_pool(spec: LabSpec):
    """The session's pool of machines for a spec, started on first use."""
    if spec not in _POOLS:
        _POOLS[spec] = spec.kind.pool(spec.personality, _VM_HOSTS[0])
    return _POOLS[spec]


_LEAKS: list[str] = []  # what the runs' pools found left on their hosts when they closed


def close_pools() -> None:
    while _POOLS:
        spec, pool = _POOLS.popitem()
        _close(spec, pool)


def _close(spec, pool) -> None:
    pool.close()
    _LEAKS.extend(f"{spec.option}: {leak}" for leak in pool.leaks)


def parse_lab_options(texts) -> list[LabSpec]:
    """Every --lab given, in order, without repeats."""
    specs: list[LabSpec] = []
    for text in texts or ["model"]:
        specs += [s for s in parse_lab_option(text) if s not in specs]
    return specs


def parse_lab_option(text: str) -> list[LabSpec]:
    """"model" -> every model personality; "model:ib,roce" -> those; "vm" = "vm:rxe";
    "vm:rxe,siw" -> the VM lab with each device; "netns:rxe" -> the netns lab;
    "inventory:PATH" -> the inventory's hosts. The text is checked by rdmalab.run.inputs (the
    one place labs are validated; a colon with nothing after it is refused); its BadInput is
    a pytest.UsageError. The inventory's content is checked by check_inventories."""
    try:
        name, names = inputs.lab_parts(text)
    except inputs.BadInput as e:
        raise pytest.UsageError(str(e)) from None
    kind = LAB_KINDS[name]
    why = kind.unavailable()
    if why:
        raise pytest.UsageError(f"--lab {text!r}: the {kind.title} cannot run here: {why}")
    return [LabSpec(name, n) for n in names]


def check_inventories(specs: list[LabSpec], deadline_s: float = PROBE_DEADLINE_S) -> None:
    """Before any scenario: each inventory read and checked (rdmalab.run.inputs), and each of its
    hosts reached once over ssh, all at once, within deadline_s. A malformed file, or hosts
    that cannot be reached (no route, refused, unknown or changed host key, login refused, no
    answer), is one pytest.UsageError naming the file, line and field, or each host and why;
    never an error per scenario. A pytest-xdist worker does not probe again."""
    for spec in specs:
        if not spec.kind.inventory_file:
            continue
        try:
            inv = inputs.inventory(spec.personality)
        except inputs.BadInput as e:
            raise pytest.UsageError(str(e)) from None
        if os.environ.get("PYTEST_XDIST_WORKER"):
            continue
        from ..machines.sshmachine import inventory_machines, unreachable
        problems = unreachable(inventory_machines(inv), deadline_s)
        if problems:
            raise pytest.UsageError(
                f"--lab {spec.option}: {len(problems)} of the inventory's {len(inv.hosts)} "
                f"hosts cannot be reached over ssh (each tried once, {deadline_s:g} s "
                "deadline); fix them or take them out of the inventory:\n"
                + "\n".join(f"  {inv.path}:{m.entry.line}: host \"{m.name}\": {why}"
                            for m, why in problems))


@dataclasses.dataclass
class Settings:
    specs: list[LabSpec]
    seed: int
    history_dir: Optional[str]
    timeout_s: float
    evidence_dir: Optional[str] = None
    evidence_temp: bool = False  # made for this session: the oracle runs without a bundle asked


def pytest_addoption(parser):
    group = parser.getgroup("rdmalab")
    group.addoption("--lab", action="append", default=None,
                    help='labs to run on, repeatable: "model" (every personality), '
                         '"model:ib,roce", "vm" or "vm:rxe,siw" (the soft-RoCE VM lab), '
                         '"netns:rxe" (hosts as network namespaces on one kernel), '
                         '"inventory:PATH" (the machines of a TOML inventory)')
    group.addoption("--vm-hosts", type=int, default=2,
                    help="hosts (VMs) in the VM lab (default 2)")
    group.addoption("--kernel", default=None, metavar="SUITE|RELEASE",
                    help="the VM lab's guest kernel: bookworm (default), trixie, sid, or a "
                         "Debian release such as 6.12.117+deb13-amd64 (also "
                         "RDMALAB_VM_KERNEL)")
    group.addoption("--seed", type=int, default=1, help="seed of every lab (default 1)")
    group.addoption("--history-dir", default=None,
                    help="write one JSON-lines history per lab into this directory")
    group.addoption("--evidence-dir", default=None,
                    help="an evidence bundle per scenario on device labs (capture, rdma res, "
                         "kernel logs and their splats) in this directory; default: "
                         "`evidence` beside --history-dir when that is given")
    group.addoption("--rdmalab-timeout", type=float, default=300.0,
                    help="wall-clock seconds per test before it fails (0 = no limit)")
    group.addoption("--findings-registry", default=None,
                    help="the findings registry the @finding markers name (default: the "
                         "package's findings.toml)")
    metrics_pytest.add_options(group)


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
    _VM_HOSTS[0] = config.getoption("vm_hosts")
    if _VM_HOSTS[0] < 1:
        raise pytest.UsageError(f"--vm-hosts {_VM_HOSTS[0]}: at least 1")
    specs = parse_lab_options(config.getoption("lab"))
    check_inventories(specs)
    config.stash[_SETTINGS] = Settings(specs, config.getoption("seed"),
                                       config.getoption("history_dir"),
                                       config.getoption("rdmalab_timeout"),
                                       evidence_dir(config))
    config.stash[_FAILURES] = []
    config.stash[_RESULTS] = []
    config.pluginmanager.register(_ResultCollector(config), "rdmalab-results")
    metrics_pytest.configure(config, config.stash[_SETTINGS].specs)
    from . import progress  # long waits' progress lines, written past pytest's capture
    progress.install_pytest_sink(config)


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
    close_pools()  # before the summary, which reports what they left on their hosts


def pytest_unconfigure(config):
    close_pools()


def pytest_generate_tests(metafunc):
    if "lab_spec" not in metafunc.fixturenames:
        return
    if any("lab_spec" in m.args[0] for m in metafunc.definition.iter_markers("parametrize")):
        return  # the test chose its own specs
    specs = metafunc.config.stash[_SETTINGS].specs
    metafunc.parametrize("lab_spec", specs, ids=[s.id for s in specs])


# -- fixtures

@pytest.fixture
def lab_spec(request) -> LabSpec:
    """The lab this test runs on (parametrized from --lab)."""
    return getattr(request, "param", request.config.stash[_SETTINGS].specs[0])


@pytest.fixture
def personality(lab_spec) -> str:
    return lab_spec.personality


@pytest.fixture
def rdmalab_seed(request) -> int:
    return request.config.stash[_SETTINGS].seed


@pytest.fixture
def lab_factory(request, lab_spec):
    """make(hosts=("a", "b"), seed=None, **model_lab options) -> Lab, of this test's
    personality and (unless seed= is given) the run's seed; every lab is shut down after the
    test and its history written."""
    settings = request.config.stash[_SETTINGS]
    labs: list[Lab] = []
    request.node.stash[_LABS] = labs
    collectors: list = []
    request.node.stash[_EVIDENCE] = collectors

    def make(hosts=DEFAULT_HOSTS, seed: Optional[int] = None, **options) -> Lab:
        lab = lab_spec.build(settings.seed if seed is None else seed, hosts, **options)
        lab.replay = replay_command(request.node, lab_spec, settings.seed)
        labs.append(lab)
        metrics_pytest.attach(request.config, lab)
        collectors.append(_start_evidence(request.node, lab, lab_spec, settings, collectors))
        return lab

    yield make
    _finish_labs(request.node, labs, settings)


@pytest.fixture
def lab(lab_factory) -> Lab:
    """A two-host lab ("a", "b") of this test's personality."""
    return lab_factory()


@pytest.fixture
def hosts(lab):
    return tuple(lab.hosts.values())


def _start_evidence(item, lab, spec: LabSpec, settings: Settings, collectors: list):
    """An evidence.Collector begun for a device lab when bundles are wanted, else None. A
    test's second lab renames the first's bundle <stem>.1 (as its history is named)."""
    if not spec.kind.device:
        return None
    if not settings.evidence_dir:  # the kernel-log oracle needs a bundle to put splats in
        settings.evidence_dir = tempfile.mkdtemp(prefix="rdmalab-evidence-")
        settings.evidence_temp = True
    from ..report import evidence
    stem = history_name(item.nodeid)
    n = len(collectors) + 1
    if n == 2 and collectors[0] is not None:
        first = collectors[0]
        moved = first.dir.with_name(f"{stem}.1")
        shutil.rmtree(moved, ignore_errors=True)
        first.dir.rename(moved)
        first.dir = moved
    name = stem if n == 1 else f"{stem}.{n}"
    try:
        reg = registry(item.config)
    except pytest.UsageError:
        reg = None
    directory = os.path.join(settings.evidence_dir, name)
    shutil.rmtree(directory, ignore_errors=True)  # a rerun's bundle replaces the last one's
    c = evidence.Collector(lab, directory, scenario=item.nodeid, column=spec.id, registry=reg)
    c.begin()
    return c


def _finish_labs(item, labs: list[Lab], settings: Settings) -> None:
    collectors = item.stash.get(_EVIDENCE, [])
    files = item.stash.setdefault(_FILES, {"history": [], "evidence": []})
    splats = item.stash.setdefault(_SPLATS, [])
    try:
        for i, lab in enumerate(labs):
            c = collectors[i] if i < len(collectors) else None
            path = None
            if settings.history_dir:
                suffix = f".{i + 1}" if len(labs) > 1 else ""
                path = os.path.join(settings.history_dir,
                                    history_name(item.nodeid) + suffix + ".jsonl")
            if c is None:
                if path:
                    lab.write_history(path)
                    files["history"].append(path)
                lab.shutdown()
                continue
            # A device lab with evidence: its history is written once the shutdown's kernel
            # log and the capture are in it.
            try:
                c.scenario_end()
                lab.shutdown()
            finally:
                splats += [dict(s, evidence=str(c.dir)) for s in c.finish()]
                if path:
                    lab.write_history(path)
                    files["history"].append(path)
                c.write_history(path)
                files["evidence"].append(str(c.dir))
    finally:
        raise_parked()  # a handler or hook that raised fails the test here at the latest


def _relative(paths: list[str], base: Optional[str]) -> str:
    """Paths relative to the run's directory (the parent of base), comma separated."""
    root = os.path.dirname(os.path.abspath(base)) if base else os.getcwd()
    return ",".join(os.path.relpath(os.path.abspath(p), root) for p in paths)


def splat_failure(splats: list[dict]) -> str:
    """The failure text of the splats no registry entry expected ("" if none)."""
    bad = [s for s in splats if not s.get("expected_by")]
    if not bad:
        return ""
    first = bad[0]
    hosts = sorted({s["host"] for s in bad})
    return (f"KernelSplat: {len(bad)} kernel-log splat(s) on host(s) {', '.join(hosts)} during "
            f"the scenario; first on host {first['host']} ({first.get('kernel') or 'kernel ?'}): "
            f"{first['first_line']}  [{os.path.join(first['evidence'], first['file'])}]")


def replay_command(item, spec: LabSpec, seed: int) -> str:
    return (f"python3 -m rdmalab run --lab {spec.option} --seed {seed} -k '{item.name}'"
            f"  (or: python3 -m pytest -p rdmalab.run.pytest_plugin '{item.nodeid}' "
            f"--lab {spec.option} --seed {seed})")


# -- markers

def _spec_of(item) -> Optional[LabSpec]:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("lab_spec") if callspec else None


def unmet_requirement(mark, caps: DeviceCaps) -> Optional[str]:
    """Why a device does not meet @requires(...), or None if it does."""
    dev = f"device {caps.name} (personality {caps.personality})"
    for feature in mark.args:
        if feature not in FEATURES:
            raise pytest.UsageError(f"requires({feature!r}): unknown feature; "
                                    f"known: {', '.join(FEATURES)}")
        if not getattr(caps, feature):
            return (f"requires {feature}: no {FEATURES[feature]} on {caps.personality} "
                    f"({dev})")
    unknown = set(mark.kwargs) - {"transport", "event"}
    if unknown:
        raise pytest.UsageError(f"requires(): unknown keyword(s) {sorted(unknown)}; "
                                "known: transport, event")
    transports = _as_list(mark.kwargs.get("transport"))
    if transports:
        wanted = [parse(_core.Transport, t, "transport").name for t in transports]
        if caps.transport not in wanted:
            return f"requires transport={'|'.join(wanted)}: {dev} is {caps.transport}"
    for event in _as_list(mark.kwargs.get("event")):
        ev = parse(_core.AsyncEventType, event, "async event type").name
        if caps.raises_event(ev) is False:  # None: the device does not say; run and see
            return f"requires event={ev}: {dev} does not raise {ev}"
    return None


def _as_list(value) -> list:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def pytest_collection_modifyitems(config, items):
    """Turns unmet @requires into skip marks, so a skip points at the test itself."""
    for item in items:
        spec = _spec_of(item)
        if spec is None:
            continue
        for mark in item.iter_markers("requires"):
            reason = unmet_requirement(mark, spec.caps())
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))
                break
        for mark in item.iter_markers("finding"):
            found = finding_on(mark, spec, registry(config))
            if found is None:
                entry = finding_entry(mark, registry(config))
                if spec.kind.finding_key(spec.caps()) in entry.keys:
                    # Fixed in this kernel, or not there yet: it must pass.
                    running = findings.release_version(spec.caps().kernel_release)
                    before = entry.since_in and running and running < entry.since_in
                    item.stash[_FIXED] = ("finding_before" if before else "finding_fixed",
                                          entry.id)
                continue
            entry, key = found
            if _ENTRY in item.stash:
                raise pytest.UsageError(f"{item.nodeid}: two findings apply on {key}: "
                                        f"{item.stash[_ENTRY][0].id} and {entry.id}")
            item.stash[_ENTRY] = found
            if entry.xfails:
                item.add_marker(pytest.mark.xfail(strict=True, raises=entry.raises_class(),
                                                  reason=finding_reason(entry, key, spec)))
    # One lab's scenarios together, in --lab order: each machine pool then lives only while
    # its column runs (2 cores cannot carry two VM labs at once). Caps probing booted every
    # pool: all but the first go until their column comes.
    order = {spec: i for i, spec in enumerate(config.stash[_SETTINGS].specs)}
    items.sort(key=lambda it: -1 if _spec_of(it) is None else order.get(_spec_of(it), -1))
    first = next((_spec_of(it) for it in items if _spec_of(it) in _POOLS), None)
    for spec in [s for s in _POOLS if s != first]:
        _close(spec, _POOLS.pop(spec))


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """After a column's last scenario (its fixtures torn down), its machine pool goes."""
    spec = _spec_of(item)
    if spec in _POOLS and (nextitem is None or _spec_of(nextitem) != spec):
        _close(spec, _POOLS.pop(spec))


def registry(config) -> findings.Registry:
    """The run's findings registry (--findings-registry, else the package's), loaded once."""
    if _REGISTRY not in config.stash:
        path = config.getoption("findings_registry", None)
        try:
            config.stash[_REGISTRY] = findings.load(path) if path else findings.default()
        except findings.FindingsError as e:
            raise pytest.UsageError(f"the findings registry is malformed:\n{e}") from e
    return config.stash[_REGISTRY]


def finding_entry(mark, reg: Optional[findings.Registry] = None) -> findings.Entry:
    """The registry entry a @finding("<id>") names (pytest.UsageError if it names none)."""
    reg = reg if reg is not None else findings.default()
    usage = ('@pytest.mark.finding("<id>"): one argument, the id of an entry in '
             f"{reg.path}")
    if len(mark.args) != 1 or mark.kwargs or not isinstance(mark.args[0], str):
        given = ", ".join([repr(a) for a in mark.args]
                          + [f"{k}={v!r}" for k, v in mark.kwargs.items()])
        raise pytest.UsageError(f"{usage}; got finding({given[:200]}). The old form "
                                "finding(devices, name, text, raises=...) is gone: its fields "
                                "are the entry's provider, id, summary and raises")
    try:
        return reg.get(mark.args[0])
    except KeyError as e:
        raise pytest.UsageError(f"@pytest.mark.finding({mark.args[0]!r}): {e.args[0]}") from e


def finding_on(mark, spec, reg: Optional[findings.Registry] = None
               ) -> Optional[tuple[findings.Entry, str]]:
    """(entry, key) where @finding("<id>") applies to this lab, else None. The key is the
    device's driver ("rxe") on agent labs, "model:<personality>" on the model: a model
    personality carries an entry only where the entry names it (one that copies a device)."""
    entry = finding_entry(mark, reg)
    caps = spec.caps()
    key = LAB_KINDS[spec.backend].finding_key(caps)
    release = getattr(caps, "kernel_release", "")  # a fixed kernel no longer diverges
    return (entry, key) if entry.applies_to(key, release) else None


def finding_reason(entry: findings.Entry, key: str, spec) -> str:
    return f"{entry.kind} {entry.id} on {key} ({spec.caps().name}): {entry.summary}"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    spec = _spec_of(item)
    if spec is None and item.get_closest_marker("requires") is not None:
        pytest.fail(f"{item.nodeid}: @requires needs a lab (use the lab, hosts or lab_factory "
                    "fixture)", pytrace=False)
    if spec is not None and spec.kind.pooled:
        # The caps the report's row names, probed before the scenario's lab: after its
        # column's last scenario the machine pool closes, and a probe at the row's
        # teardown would start the pool again (~40 s on TCG guests) just for that.
        try:
            spec.caps()
        except pytest.UsageError:
            pass  # the lab fixture says why the lab cannot start


# -- reporting

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if call.excinfo is not None and call.excinfo.errisinstance(FaultNotSupported):
        # The backend lacks the fault the scenario needs: a skip naming it, not a failure.
        rep.outcome = "skipped"
        rep.longrepr = (str(item.path), item.location[1] or 0,
                        f"Skipped: {call.excinfo.value}")
    spec = _spec_of(item)
    if spec is None:
        return
    seed = item.config.stash[_SETTINGS].seed
    phases = item.stash.setdefault(_PHASES, {})
    lost = lost_hosts(item)
    if lost and rep.when in ("call", "teardown") and not phases.get("host_lost"):
        # A host that died mid-scenario: the outcome says which and when, whatever the
        # scenario's own error was (an EOFError from a dead agent tells nothing).
        rep.outcome = "failed"
        text = "; ".join(f"host {h} ({i.get('machine')}) lost at t={i.get('at_ns', 0) / 1e9:.3f} s:"
                         f" {i.get('error')} ({i.get('records_kept')} of its records kept)"
                         for h, i in lost.items())
        if call.excinfo is not None:
            rep.sections.append(("rdmalab: the scenario's own error",
                                 call.excinfo.exconly()))
        rep.longrepr = f"HostLost: {text}"
        phases["host_lost"] = text
    splats = item.stash.get(_SPLATS, [])
    failure = splat_failure(splats) if rep.when == "teardown" else ""
    if failure and not phases.get("host_lost"):
        # A kernel splat fails the scenario whatever it asserted: its lab's shutdown is in
        # the window, so it is judged here, after the labs are gone.
        rep.outcome = "failed"
        if call.excinfo is not None:
            rep.sections.append(("rdmalab: the teardown's own error", call.excinfo.exconly()))
        rep.longrepr = failure + "\n" + "\n".join(
            f"  {s['host']}: {s['kind']}: {s['first_line']}"
            + (f" (expected by {s['expected_by']})" if s.get("expected_by") else "")
            for s in splats)
        phases["kernel_splat"] = failure
    phases[rep.when] = rep.outcome
    if rep.when == "call" and hasattr(rep, "wasxfail"):
        phases["xfail"] = "finding" if rep.skipped else "xpassed"
    if rep.failed:
        text = f"seed {seed} on {spec.option}\nreplay: {replay_command(item, spec, seed)}"
        rep.sections.append(("rdmalab", text))
        item.config.stash[_FAILURES].append((item.nodeid, replay_command(item, spec, seed)))
    if rep.when == "teardown":
        try:
            device = spec.caps().name
        except Exception as e:  # the table still gets a row
            device = f"? ({e})"
        try:
            provider = spec.caps().personality
            kernel = spec.caps().kernel_release
        except Exception:
            provider = kernel = ""
        item.user_properties += [("backend", spec.backend), ("personality", spec.personality),
                                 ("column", spec.id), ("provider", provider),
                                 ("device", device), ("kernel", kernel), ("seed", seed),
                                 ("outcome", final_outcome(phases))]
        if _ENTRY in item.stash:
            entry = item.stash[_ENTRY][0]
            item.user_properties.append(
                ("finding" if entry.xfails else "provider_fact", entry.id))
        if _FIXED in item.stash:
            item.user_properties.append(item.stash[_FIXED])
        if phases.get("xfail") == "xpassed":
            item.user_properties.append(("xpassed", "true"))
        settings = item.config.stash[_SETTINGS]
        files = item.stash.get(_FILES, {})
        if files.get("history"):
            item.user_properties.append(("history", _relative(files["history"],
                                                              settings.history_dir)))
        if files.get("evidence"):
            item.user_properties.append(("evidence", _relative(files["evidence"],
                                                               settings.evidence_dir)))
        if splats:
            item.user_properties.append(("kernel_splat", splats[0]["first_line"]))
            expected = sorted({s["expected_by"] for s in splats if s.get("expected_by")})
            if expected:
                item.user_properties.append(("kernel_splat_expected", ",".join(expected)))
        rep.user_properties = list(item.user_properties)


def lost_hosts(item) -> dict:
    """host -> loss info of every lab the test made."""
    lost = {}
    for lab in item.stash.get(_LABS, []):
        lost.update(lab.lost_hosts())
    return lost


def final_outcome(phases: dict) -> str:
    if phases.get("host_lost"):
        return "host_lost"
    if phases.get("call") == "failed" or phases.get("kernel_splat"):
        return "failed"
    if "failed" in phases.values():
        return "error"
    if phases.get("xfail") == "finding":
        return "finding"
    if "skipped" in phases.values():
        return "skipped"
    return "passed"


class _ResultCollector:
    """Keeps each test's final outcome per column (its teardown report's properties; with
    pytest-xdist these arrive from the workers) for the agreement summary."""

    def __init__(self, config):
        self.config = config

    def pytest_runtest_logreport(self, report):
        if report.when != "teardown":
            return
        props = dict(report.user_properties)
        if "column" not in props:
            return
        self.config.stash[_RESULTS].append(result_of(report.nodeid, props))


def result_of(nodeid: str, props: dict) -> report.Result:
    """A report.Result (the table's row, column, outcome) from a test's properties."""
    scenario, column = report.split_nodeid(nodeid, props)
    message = "[XPASS(strict)]" if props.get("xpassed") else ""
    return report.Result(scenario, column, str(props.get("outcome", "")), message,
                         {k: str(v) for k, v in props.items()})


def _device_column(result: report.Result) -> bool:
    kind = LAB_KINDS.get(result.properties.get("backend"))
    return kind is not None and kind.device


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    results = config.stash.get(_RESULTS, [])
    if any(_device_column(r) for r in results):
        terminalreporter.section("rdmalab: model vs device")
        try:
            reg = registry(config)
        except pytest.UsageError:
            reg = None
        for line in agreement.lines(results, reg):
            terminalreporter.write_line(line)
    if _LEAKS:
        terminalreporter.section("rdmalab: left on the hosts after the run (health check)")
        for leak in _LEAKS:
            terminalreporter.write_line(leak)
    settings = config.stash.get(_SETTINGS, None)
    if settings is not None and settings.evidence_temp:
        if exitstatus == 0:
            shutil.rmtree(settings.evidence_dir, ignore_errors=True)
        else:
            terminalreporter.write_line(f"rdmalab: evidence bundles (no --history-dir or "
                                        f"--evidence-dir given): {settings.evidence_dir}")
    failures = config.stash.get(_FAILURES, [])
    if not failures:
        return
    terminalreporter.section("rdmalab: replay failures")
    for nodeid, command in dict(failures).items():
        terminalreporter.write_line(f"{nodeid}\n    {command}")


# -- wall-clock safety net

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    timeout = item.config.stash[_SETTINGS].timeout_s
    if (timeout <= 0 or not hasattr(signal, "SIGALRM")
            or threading.current_thread() is not threading.main_thread()):
        yield
        return

    def on_alarm(signum, frame):
        raise WallClockTimeout(f"{item.nodeid} ran longer than {timeout:g} s of wall-clock time "
                               "(rdmalab safety net, --rdmalab-timeout)")

    old_handler = signal.signal(signal.SIGALRM, on_alarm)
    old_timer = signal.setitimer(signal.ITIMER_REAL, timeout)
    # If the engine never returns to Python the alarm cannot be raised: dump every thread's
    # stack and exit rather than hang the run.
    try:
        faulthandler.dump_traceback_later(timeout + HARD_TIMEOUT_GRACE_S, exit=True,
                                          file=sys.__stderr__)
    except (AttributeError, OSError, ValueError):  # no real stderr: only the soft net
        pass
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        if old_timer[0] > 0:  # an outer session's net (pytester runs nest sessions)
            signal.setitimer(signal.ITIMER_REAL, old_timer[0])
