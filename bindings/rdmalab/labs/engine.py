"""Labs, hosts and processes: where a scenario gets its devices.

    lab = rdmalab.model_lab(seed=1, hosts={"a": "ib", "b": "ib"})
    proc = lab.host("a").process("server")
    ctx = proc.open_device()

Time is in ns (rdmalab.us/ms/sec convert). In the model it is virtual: waits are instant in
wall-clock terms, and the same seed replays the same run.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import weakref
from typing import Callable, Iterable, Mapping, Optional, Union

from .. import _core
from ..api.cm import CmChannel
from ..errors import Error, FaultNotSupported, Hung, as_fault, deadline_ns, raise_parked
from ..errors import duration_ns as duration_ns_of
from ..faults import Faults, NoFaults
from .. import kernel
from ..names import parse, sec
from ..protocol import (CM_PROTOCOL_STATE, KERNEL_ULP, SRQ_OCCUPANCY, STATE_DUMP,
                        VIRTUAL_TIME)
from ..api.verbs import Context, DeviceCaps, unwrap

HISTORY_TAIL = 50  # records in a Hung dump
# The model's planted defects, name -> what it breaks (core/include/rdmalab/mutation.h): the
# swarm's mutation test switches them on with model_lab(mutations=...) and must find each.
MUTATIONS: dict[str, str] = dict(_core.mutations())

_LIVE: "weakref.WeakSet[EngineLab]" = weakref.WeakSet()


@atexit.register
def _shutdown_live_labs() -> None:
    # Harness threads must end before the interpreter does: a handler thread that wants the
    # GIL during finalization would hang the exit.
    for lab in list(_LIVE):
        lab.shutdown()


class Process:
    """A process on a host: it opens devices and owns what it creates; kill() is SIGKILL."""

    def __init__(self, host: "Host", o):
        self.host, self._o = host, o

    name = property(lambda self: self._o.name)
    pid = property(lambda self: self._o.pid)
    alive = property(lambda self: self._o.alive)

    def open_device(self, device_name: str = "") -> Context:
        ctx = Context(self, self._o.open_device(device_name))
        raise_parked()
        return ctx

    def event_channel(self, workers: int = 2) -> CmChannel:
        """rdma_create_event_channel, with its event pump started (rdmalab.api.cm)."""
        ch = CmChannel(self, self._o.create_event_channel(), workers)
        raise_parked()
        return ch

    def kernel_objects(self) -> dict[str, int]:
        """What the kernel holds for this process, by kind as `rdma res show` names them
        (ctx, pd, cq, qp, srq, mr, cm_id, xrcd); empty once a kill has been cleaned up."""
        return dict(as_fault("kernel_objects", self._o.kernel_objects))

    def kill(self) -> None:
        """SIGKILL: the kernel releases everything the process owned, without waiting for
        acks (uverbs and ucma cleanup on file close)."""
        as_fault("kill", self._o.kill)  # EOPNOTSUPP: the harness's own process
        raise_parked()

    def __repr__(self) -> str:
        return f"<Process {self.name} pid {self.pid} on {self.host.name}>"


class Host:
    def __init__(self, lab: "EngineLab", o):
        self.lab, self._o = lab, o

    name = property(lambda self: self._o.name)

    @property
    def devices(self) -> list[str]:
        return self._o.device_names()

    def caps(self, device_name: str = "") -> DeviceCaps:
        """Capabilities of a device ("" = the first one) without opening it."""
        core = self._o.device_caps(device_name or self.devices[0])
        return DeviceCaps.from_core(core, self.lab.kernel_identity(core))

    def process(self, name: str) -> Process:
        """Starts a new process named name."""
        proc = Process(self, self._o.create_process(name))
        raise_parked()
        return proc

    @property
    def processes(self) -> list[Process]:
        return [Process(self, p) for p in self._o.processes()]

    def __repr__(self) -> str:
        return f"<Host {self.name}>"


class EngineLab:
    """A lab of hosts in one engine (rdmalab.protocol.Lab): the model (ModelLab) or
    this machine's own devices (VerbsLab, what a host agent runs). Use as a context manager,
    or call shutdown()."""

    capabilities: frozenset = frozenset()
    mutations: tuple = ()  # planted defects on (model_lab(mutations=...)); devices: none

    def __init__(self, core: _core.Lab, description: str = ""):
        self._o = core
        self.description = description
        self.replay = ""  # how to replay this run; the pytest plugin sets it
        self._hosts = {h.name: Host(self, h) for h in core.hosts()}
        self._faults = self._make_faults()
        self._shut = False
        self._closers: list[Callable[[], None]] = []
        self._shutdown_hooks: list[Callable[["EngineLab"], None]] = []
        # Where rdma_cm finds another host: its name in the model, an IP address on devices.
        self.addresses: dict[str, str] = {}
        _LIVE.add(self)

    # -- identity
    backend = property(lambda self: self._o.backend)
    seed = property(lambda self: self._o.seed)
    now_ns = property(lambda self: self._o.now_ns)

    # Time bounds in scenarios are exact on the model; on devices they get this much more
    # (timers, event threads and the controller's round trips run on real clocks).
    tolerance_ns = 0
    # A kernel timer the model predicts to the tick (the timer wheel: rdmalab.api.cm_timing) runs
    # on a device that much later at most (softirq, workqueue, the event's way to the harness).
    timer_slack_ns = 0

    def kernel_identity(self, caps: _core.DeviceCaps) -> kernel.KernelIdentity:
        """The kernel this process runs on: the devices' host's."""
        return kernel.this_kernel()

    def stalled_ns(self, host: str, from_ns: int, to_ns: int) -> int:
        """How long host's machine stood still between two lab times: what a timer or event
        measured there may be late by beyond timer_slack_ns. 0 here: an engine lab's clock
        is virtual (the model) or this process's (VerbsLab measures it)."""
        self.host(host)  # an unknown host is an error, as everywhere
        return 0

    def _make_faults(self):
        return NoFaults(self)

    t0_ns = 0  # the history's t_ns is the engine's clock

    def has(self, capability: str) -> bool:
        """Whether this lab has a capability (rdmalab.protocol)."""
        return capability in self.capabilities

    @property
    def replayable(self) -> bool:
        """True where one seed replays one run exactly (a seeded virtual clock: the model)."""
        return self.has(VIRTUAL_TIME)

    def place(self, anchor) -> None:
        """Everything of an engine lab is built in this process."""
        return None

    def devices_by_host(self) -> dict[str, str]:
        """host -> the device label metrics use (the personality or provider)."""
        return self._caps_by_host("personality", "none")

    def kernels_by_host(self) -> dict[str, str]:
        return self._caps_by_host("kernel_release", "")

    def _caps_by_host(self, field: str, without_device: str) -> dict[str, str]:
        out = {}
        for name, host in self._hosts.items():
            try:
                out[name] = getattr(host.caps(), field)
            except Error:  # a host without a device
                out[name] = without_device
        return out

    def attach_metrics(self, metrics) -> None:
        """Feeds the engine's history into metrics as it is written."""
        metrics._o.attach(self._o)

    def lost_hosts(self) -> dict[str, dict]:
        """Hosts lost mid-scenario (none: an engine lab's hosts are in this process)."""
        return {}

    def on_shutdown(self, fn: Callable[["EngineLab"], None]) -> None:
        """fn(lab) after the lab has shut down, its history complete."""
        self._shutdown_hooks.append(fn)

    @property
    def hosts(self) -> dict[str, Host]:
        return dict(self._hosts)

    def host(self, name: str) -> Host:
        if name not in self._hosts:
            self._o.host(name)  # raises the engine's Error(ENOENT)
        return self._hosts[name]

    def address_of(self, host: str) -> str:
        """The address rdma_resolve_addr is given for a host named in the scenario."""
        return self.addresses.get(host, host)

    @property
    def faults(self) -> Union[Faults, NoFaults]:
        """The fault verbs the backend offers; others raise FaultNotSupported."""
        return self._faults

    # -- time
    # Durations and timeouts are ns >= 0: a negative one is refused (Error EINVAL, "duration_ns
    # = -1 is negative"), on every lab kind, before any time passes.
    def run_for(self, duration_ns: int) -> None:
        """Lets the lab run for duration_ns (the model: events and harness threads)."""
        self._o.sleep_for(duration_ns_of("run_for", duration_ns))
        raise_parked()

    def sleep(self, duration_ns: int) -> None:
        """The controller sleeps; other threads and events run meanwhile."""
        self._o.sleep_for(duration_ns_of("sleep", duration_ns))
        raise_parked()

    def wait_until(self, pred: Callable[[], bool], timeout_ns: int = sec(10),
                   what: str = "condition") -> None:
        """Waits until pred() is true. pred must be cheap and side-effect free (the model
        evaluates it whenever it schedules). Raises Hung, with a diagnostic dump, at timeout."""
        start = self.now_ns
        deadline = deadline_ns("wait_until", start, timeout_ns)
        ok = self._o.wait_until(pred, deadline)
        raise_parked()
        if not ok:
            raise Hung(what, self.diagnostic(f"waited {timeout_ns} ns for {what} "
                                             f"(from t={start} ns to t={self.now_ns} ns)"))

    def spawn(self, name: str, fn: Callable[[], None]) -> None:
        """Runs fn on a harness thread (in the model a simulated thread, scheduled by seed)."""
        self._o.spawn(name, fn)

    # -- history
    def history(self, since_seq: int = 0) -> list[dict]:
        """Records as dicts: seq, t_ns, host, object, kind, data."""
        text = self._o.history_since_jsonl(since_seq) if since_seq else self._o.history_jsonl()
        return [json.loads(line) for line in text.splitlines() if line]

    def write_history(self, path: Union[str, os.PathLike]) -> None:
        """The history as JSON lines (byte-identical for one seed in the model)."""
        os.makedirs(os.path.dirname(os.fspath(path)) or ".", exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(self._o.history_jsonl())

    def record(self, kind: str, object: str = "scenario", host: str = "", **data) -> int:
        """Adds a scenario record (a note, a checkpoint) to the history; returns its seq."""
        return self._o.record(host, object, kind, json.dumps(data))

    # -- diagnostics
    def dump_state(self) -> str:
        return f"({self.description or self.backend} has no state dump)"

    def diagnostic(self, headline: str) -> str:
        """The dump a hung wait prints: what, seed, replay, state and the history's tail."""
        size = self._o.history_size()
        tail = self.history(max(0, self._o.history_next_seq() - HISTORY_TAIL))[-HISTORY_TAIL:]
        lines = [f"Hung: {headline}",
                 f"lab: {self.description or self.backend} seed={self.seed} now_ns={self.now_ns}"]
        if self.replay:
            lines.append(f"replay: {self.replay}")
        lines += ["--- state ---", self.dump_state().rstrip(),
                  f"--- last {len(tail)} of {size} history records ---"]
        lines += [json.dumps(r, sort_keys=True) for r in tail]
        return "\n".join(lines)

    def check_errors(self) -> None:
        """Re-raises exceptions parked by Python callbacks the engine ran."""
        raise_parked()

    # -- lifetime
    def shutdown(self) -> None:
        """Stops harness threads and releases everything. Idempotent."""
        if self._shut:
            return
        self._shut = True
        for close in reversed(self._closers):
            try:
                close()
            except Error as e:  # the lab goes anyway; the history keeps what went wrong
                self.record("shutdown_error", object="lab", error=str(e))
        self._closers.clear()
        self._faults.clear()
        self._o.shutdown()
        for hook in self._shutdown_hooks:
            hook(self)

    def killable_process(self, host: str, name: str) -> Process:
        """A process that a fault may SIGKILL (process.kill()). Every model process can be
        killed, so here it is host(host).process(name); the VM lab runs it as an OS process of
        its own in the guest, and the local verbs lab cannot kill (it is the harness)."""
        return self.host(host).process(name)

    def fresh_hosts(self, *names: str) -> None:
        """Makes these hosts as if just booted (first QPN next, no state). A model lab's hosts
        always are; an agent lab deletes and adds again the soft device (rxe, siw) of a host
        that earlier labs used, and reboots a host with any other device."""
        for name in names:
            self.host(name)  # KeyError for a host the lab does not have

    def free_devices(self, *names: str) -> None:
        """No process on these hosts holds a device open. A model lab's processes are the
        scenario's own; an agent lab starts the host's agent again (AgentLab.free_devices)."""
        for name in names:
            self.host(name)  # KeyError for a host the lab does not have

    def add_closer(self, fn: Callable[[], None]) -> None:
        """fn runs at shutdown, before the engine stops (event pumps, a workload's watchers
        and writers stop their threads while records are still taken)."""
        self._closers.append(fn)

    def run_on(self, host: str, module: str, function: str, *args,
               deadline_s: float = 60.0):
        """module.function(this lab, *args) (rdmalab.protocol.Lab.run_on): in this process,
        on a lab of this machine's own kernel (a host's agent); the model has no kernel."""
        self.host(host)  # KeyError for a host the lab does not have
        if not self.has(KERNEL_ULP):
            raise FaultNotSupported("kernel_ulp", f"{self.description or self.backend} runs "
                                    "no kernel whose ULPs a workload drives")
        return getattr(importlib.import_module(module), function)(self, *args)

    def __enter__(self) -> "EngineLab":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        desc = self.description or self.backend
        return f"<EngineLab {desc} seed={self.seed} hosts={list(self._hosts)}>"


class ModelLab(EngineLab):
    """The model: every host, device and the fabric in this process, on a seeded virtual
    clock; it applies every fault."""

    capabilities = frozenset({VIRTUAL_TIME, CM_PROTOCOL_STATE, SRQ_OCCUPANCY, STATE_DUMP})

    def _make_faults(self):
        return Faults(self)

    def kernel_identity(self, caps: _core.DeviceCaps) -> kernel.KernelIdentity:
        """The kernel a personality copies: its timer tick and TCP sysctl from the engine."""
        return kernel.KernelIdentity(caps.kernel_hz, kernel.MODEL_KERNEL_RELEASE,
                                     caps.tcp_syn_retries)

    def run_for(self, duration_ns: int) -> None:
        self._o.run_for(duration_ns_of("run_for", duration_ns))
        raise_parked()

    def dump_state(self) -> str:
        return self._o.dump_state()


class VerbsLab(EngineLab):
    """This machine's RDMA devices as one host (what a host agent runs)."""

    capabilities = frozenset({KERNEL_ULP})

    def stalled_ns(self, host: str, from_ns: int, to_ns: int) -> int:
        self.host(host)
        return self._o.stalled_ns(from_ns, to_ns)  # the engine's StallMeter


HostsArg = Union[Mapping[str, Union[str, Mapping]], Iterable[str]]


def model_lab(seed: int = 1, hosts: HostsArg = ("a", "b"), personality: str = "ib", *,
              latency_ns: Optional[int] = None, jitter_ns: Optional[int] = None,
              loss_ppm: Optional[int] = None, mutations: Iterable[str] = ()) -> EngineLab:
    """A model lab. hosts: names (each gets `personality`), or {name: personality} or
    {name: {"personality": ..., "xrc_tgt_lifetime": "handle" | "xrcd"}}. mutations: planted
    defects to switch on (names from MUTATIONS; none by default), recorded in lab_start."""
    opts = _core.LabOptions()
    opts.seed = seed
    opts.mutations = _mutation_names(mutations)
    opts.hosts = [_host_spec(n, s) for n, s in _host_items(hosts, personality)]
    for key, value in (("latency_ns", latency_ns), ("jitter_ns", jitter_ns),
                       ("loss_ppm", loss_ppm)):
        if value is not None:
            setattr(opts.fabric, key, value)
    desc = "model:" + ",".join(sorted({h.personality for h in opts.hosts}))
    lab = ModelLab(_core.make_lab(opts), desc)
    lab.mutations = tuple(opts.mutations)
    return lab


def verbs_lab(seed: int = 1, host: str = "local",
              addresses: Optional[Mapping[str, str]] = None) -> EngineLab:
    """This machine's RDMA devices as one host named `host` (the VM lab's agents make one
    each). addresses: host name -> IP address, for rdma_cm to reach the other hosts."""
    lab = VerbsLab(_core.make_verbs_lab(seed, host), f"verbs:{host}")
    lab.addresses = dict(addresses or {})  # a mapping or (name, address) pairs
    return lab


def personalities() -> list[str]:
    """The model's device personalities ("ib", "roce", "iwarp-siw", ...)."""
    return list(_core.personalities())


def _mutation_names(mutations: Iterable[str]) -> list[str]:
    if isinstance(mutations, str):
        raise TypeError("mutations must be a list of names, not a str")
    names = list(mutations)
    unknown = [m for m in names if m not in MUTATIONS]
    if unknown:
        raise ValueError(f"unknown mutation {unknown[0]!r}; known: {', '.join(MUTATIONS)}")
    return names


def _host_items(hosts: HostsArg, personality: str):
    if isinstance(hosts, str):
        raise TypeError("hosts must be names or a mapping, not a str")
    if isinstance(hosts, Mapping):
        return list(hosts.items())
    return [(h, personality) for h in hosts]


def _host_spec(name: str, spec) -> _core.HostSpec:
    hs = _core.HostSpec()
    hs.name = name
    if isinstance(spec, str):
        spec = {"personality": spec}
    if not isinstance(spec, Mapping):
        raise TypeError(f"host {name!r}: a personality name or a dict, got {type(spec).__name__}")
    unknown = set(spec) - {"personality", "xrc_tgt_lifetime"}
    if unknown:
        raise TypeError(f"host {name!r}: unknown keys {sorted(unknown)}; "
                        "allowed: personality, xrc_tgt_lifetime")
    known = personalities()
    p = spec.get("personality", "ib")
    if p not in known:
        raise ValueError(f"host {name!r}: unknown personality {p!r}; allowed: {', '.join(known)}")
    hs.personality = p
    if spec.get("xrc_tgt_lifetime") is not None:
        hs.xrc_tgt_lifetime = parse(_core.XrcTgtLifetime, spec["xrc_tgt_lifetime"],
                                    "XRC TGT lifetime")
    return hs


__all__ = ["EngineLab", "ModelLab", "VerbsLab", "Host", "Process", "model_lab", "verbs_lab", "personalities", "unwrap"]
