"""Hosts in other processes and on other machines: the controller drives the Python host API
of an agent (rdmalab.agent.serve) through execnet, the remote-execution path that works over SSH.

execnet carries bytes; RPyC, over an execnet channel, makes the agent's objects usable here as
proxies (netrefs): `lab.host("a")` in a VM lab is the agent's Host, and everything made from it
(processes, contexts, QPs, CM ids) lives in the agent. Objects that must sit beside the verbs
objects they use (Traffic, Dispatcher, Player, CmSide, drain) are built in the agent: the
constructors in rdmalab.api.stack / rdmalab.api.resources ask `placement()` where their anchor lives.

    gw = execnet.makegateway("ssh=vm1//ssh_config=...//python=/usr/bin/python3")
    agent = Agent.start(gw, host="a", seed=1, addresses={"a": "10.0.0.1", "b": "10.0.0.2"})
    lab = agent.lab          # the agent's rdmalab.Lab (verbs backend)
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
import time
from typing import Any, Optional

try:  # the model needs none of this; a verbs-only install may lack RPyC
    import rpyc
    from rpyc.core import consts, netref
    from rpyc.core.stream import Stream
except ImportError:  # pragma: no cover - Debian's python3-rpyc is a dependency
    rpyc = netref = consts = None
    Stream = object

BINDINGS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Calls may block for as long as a scenario waits on a device (a DREQ given up after 100 s);
# the engine's own deadlines bound them, so RPyC's timeout is only a last net.
RPC_TIMEOUT_S = 900
# Lab shutdown releases every verbs object; past this the agent is taken as stuck.
CLOSE_DEADLINE_S = 60.0
RPYC_CONFIG = {
    "allow_all_attrs": True, "allow_public_attrs": True, "allow_pickle": True,
    "allow_setattr": True, "allow_delattr": True, "import_custom_exceptions": True,
    "instantiate_custom_exceptions": True, "sync_request_timeout": RPC_TIMEOUT_S,
    "propagate_SystemExit_locally": True,
}

# The agent's side: runs in the remote interpreter with execnet's `channel` in scope.
AGENT_BOOT = """
import sys
sys.path.insert(0, {bindings!r})
from rdmalab.agent.serve import serve
serve(channel)
"""


class ExecnetStream(Stream):
    """An RPyC stream over an execnet channel: frames go as bytes messages; reads take exactly
    the bytes asked for, keeping the rest of a message for the next read."""

    MAX_IO_CHUNK = 64 * 1024
    __slots__ = ("_ch", "_buf", "_closed")

    def __init__(self, channel):
        self._ch = channel
        self._buf = bytearray()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed or self._ch.isclosed()

    def close(self) -> None:
        self._closed = True
        try:
            self._ch.close()
        except Exception:  # the gateway may be gone already
            pass

    def fileno(self) -> int:
        raise OSError("an execnet channel has no file descriptor")

    def _take(self, timeout: Optional[float]) -> bool:
        import execnet  # deferred: an optional dependency, as rpyc above
        try:
            chunk = self._ch.receive(timeout)
        except self._ch.TimeoutError:
            return False
        except (EOFError, execnet.RemoteError, OSError) as e:
            self._closed = True
            raise EOFError(f"agent channel closed: {e}") from e
        self._buf += chunk
        return True

    def poll(self, timeout) -> bool:
        if self._buf:
            return True
        t = getattr(timeout, "timeleft", lambda: timeout)()
        return self._take(t)

    def read(self, count: int) -> bytes:
        while len(self._buf) < count:
            self._take(None)
        data = bytes(self._buf[:count])
        del self._buf[:count]
        return data

    def write(self, data) -> None:
        try:
            self._ch.send(bytes(data))
        except (OSError, ValueError) as e:
            self._closed = True
            raise EOFError(f"agent channel closed: {e}") from e


if rpyc is not None:
    from concurrent.futures import ThreadPoolExecutor

    from rpyc.core.protocol import Connection as _Connection

    def _method_caching(cls, methods):
        """cls (a netref class) remade so that its instances keep the netref of each bound
        method they hand out: rpyc resolves every `proxy.method` with a GETATTR round trip
        and drops the bound method with a DEL after the call. Kept, a call is one round trip.
        Only names the remote class defines as callables are kept (an instance attribute is
        fetched each time); setting or deleting the name through the proxy forgets it.
        Remade with type(), as rpyc's class_factory makes it, not subclassed: a subclass
        would call the remote class's __init_subclass__ through the proxy."""
        names = frozenset(str(n) for n, _ in methods) - netref.LOCAL_ATTRS
        base = netref.BaseNetref

        def __init__(self, conn, id_pack):
            base.__init__(self, conn, id_pack)
            object.__setattr__(self, "____methods__", {})

        def __getattribute__(self, name):
            if name not in names:
                return base.__getattribute__(self, name)
            kept = object.__getattribute__(self, "____methods__")
            m = kept.get(name)
            if m is None:
                m = kept[name] = base.__getattribute__(self, name)
            return m

        def __setattr__(self, name, value):
            if name not in netref.LOCAL_ATTRS:
                object.__getattribute__(self, "____methods__").pop(name, None)
            base.__setattr__(self, name, value)

        def __delattr__(self, name):
            if name not in netref.LOCAL_ATTRS:
                object.__getattribute__(self, "____methods__").pop(name, None)
            base.__delattr__(self, name)

        ns = {k: v for k, v in vars(cls).items() if k not in ("__dict__", "__weakref__")}
        ns.update(__slots__=("____methods__",), __init__=__init__,
                  __getattribute__=__getattribute__, __setattr__=__setattr__,
                  __delattr__=__delattr__)
        return type(cls.__name__, (base,), ns)

    _VALUE_TAG = "\x00rdmalab:value"  # a copy, not a netref (CachingConnection._box)
    _PLAIN = frozenset((int, float, str, bytes, bool, type(None)))

    def _plain(v, depth: int = 0) -> bool:
        """v holds data only: what a copy of it cannot tell apart from the original."""
        if type(v) in _PLAIN:  # exact types: a netref's isinstance would ask its agent
            return True
        if depth > 4:
            return False
        if type(v) in (tuple, list, frozenset):
            return all(_plain(x, depth + 1) for x in v)
        return _is_value(v, depth + 1)

    def _is_value(obj, depth: int = 0) -> bool:
        """An instance of one of rdmalab's frozen dataclasses (WC, a drain report, ...) whose
        fields are data: immutable, so sent as a copy it reads the same as through a netref."""
        t = type(obj)
        params = getattr(t, "__dataclass_params__", None)
        if params is None or not params.frozen or not t.__module__.startswith("rdmalab."):
            return False
        return all(_plain(getattr(obj, f.name), depth)
                   for f in t.__dataclass_fields__.values())

    class CachingConnection(_Connection):
        """An RPyC connection that asks the other side for an instance's class once per class.
        rpyc 5.3 caches netref classes for remote classes only: every new remote instance (a
        completion, an event, a report) cost a HANDLE_INSPECT round trip, about a fifth of a
        scenario's round trips to a TCG guest, where each costs ~10 ms of its CPU. What
        INSPECT answers depends only on the remote type (rpyc.lib.get_methods walks
        type(obj).__mro__), so the class made for one instance serves every instance of
        that type."""

        def __init__(self, *args, **kw):
            self._instance_classes: dict = {}
            super().__init__(*args, **kw)

        def _box(self, obj):
            """A value object, or a non-empty list of them (what completions() and the
            like return), goes as a pickled copy in one message: through a netref each of
            its fields was a GETATTR round trip, each list item a __next__, and each proxy a
            DEL, ~10 ms of a TCG guest's CPU apiece (a drain scenario's 64 WCs: ~200)."""
            if _is_value(obj) or (type(obj) is list and obj and all(map(_is_value, obj))):
                return consts.LABEL_VALUE, (_VALUE_TAG, pickle.dumps(obj))
            return super()._box(obj)

        def _unbox(self, package):
            label, value = package
            if (label == consts.LABEL_VALUE and type(value) is tuple and len(value) == 2
                    and value[0] == _VALUE_TAG):
                return pickle.loads(value[1])  # noqa: S301 - our own agent, as allow_pickle
            return super()._unbox(package)

        def _netref_factory(self, id_pack):
            name_pack, class_id, instance_id = id_pack
            if instance_id == 0 or name_pack in netref.builtin_classes_cache:
                return super()._netref_factory(id_pack)
            cls = self._instance_classes.get((name_pack, class_id))
            if cls is None:
                methods = tuple(self.sync_request(consts.HANDLE_INSPECT, id_pack))
                cls = _method_caching(netref.class_factory(id_pack, methods), methods)
                self._instance_classes[(name_pack, class_id)] = cls
            return cls(self, id_pack)

    class ControllerService(rpyc.ClassicService):
        _protocol = CachingConnection

    class ThreadedConnection(CachingConnection):
        """The agent's side of the connection: each request runs in a worker thread.

        RPyC dispatches a request in the thread that read it, holding the receive lock. In the
        agent that thread would sit in a blocking call (Dispatcher.stop waiting for a running
        handler, a wait on a device) while the handler it waits for - running in a C++ event
        thread of the agent - calls the controller and needs that lock to read the reply: a
        deadlock. Arguments are unboxed in the reading thread, so requests keep their order
        up to the handler call."""

        WORKERS = 64

        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            self._workers = ThreadPoolExecutor(self.WORKERS, thread_name_prefix="rpyc-req")

        def _dispatch_request(self, seq, raw_args):
            try:
                handler, args = raw_args
                args = self._unbox(args)
            except Exception:
                return super()._dispatch_request(seq, raw_args)  # replies with the error
            self._workers.submit(self._run_request, seq, handler, args)

        def _run_request(self, seq, handler, args):
            try:
                res = self._HANDLERS[handler](self, *args)
            except BaseException:
                t, v, tb = sys.exc_info()
                self._last_traceback = tb
                if self.closed:
                    return
                try:
                    self._send(consts.MSG_EXCEPTION, seq, self._box_exc(t, v, tb))
                except Exception:  # the controller went away
                    pass
            else:
                if self.closed:
                    return
                try:
                    self._send(consts.MSG_REPLY, seq, self._box(res))
                except Exception:
                    pass

        def close(self):
            super().close()
            self._workers.shutdown(wait=False, cancel_futures=True)

    class AgentService(rpyc.ClassicService):
        _protocol = ThreadedConnection


class _Serve(threading.Thread):
    """Serves the agent's requests (handlers and predicates the controller passed it) while
    the controller's own thread is elsewhere, e.g. sleeping in lab.run_for."""

    def __init__(self, conn, name: str):
        super().__init__(name=f"rpyc-{name}", daemon=True)
        self._conn, self._stopping = conn, threading.Event()

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._conn.serve(0.05)
            except EOFError:
                return
            except Exception:  # a closed connection during shutdown
                if self._stopping.is_set() or self._conn.closed:
                    return
                time.sleep(0.05)

    def stop(self) -> None:
        self._stopping.set()


_AGENTS: dict[int, "Agent"] = {}


class Agent:
    """One agent: an execnet gateway, the RPyC connection over it, and the agent's lab."""

    def __init__(self, gateway, conn, host: str):
        self.gateway, self.conn, self.host = gateway, conn, host
        self.lab = None
        self.broken = ""  # why this agent can no longer be trusted ("" = fine)
        self.offset_ns = 0  # controller clock - agent clock (CLOCK_MONOTONIC each)
        self.pid = 0  # the agent's process id on its machine (0: not asked)
        self.labs = 0  # labs made in this agent process (new_lab)
        self._modules: dict[str, Any] = {}
        self._functions: dict[tuple[str, str], Any] = {}
        self._server = _Serve(conn, host)
        self._server.start()
        _AGENTS[id(conn)] = self

    @classmethod
    def start(cls, gateway, host: str, channel=None) -> "Agent":
        """The agent on gateway's host: over `channel` when given (rdmalab.machines.deploy's
        open_agent_channel started the version it shipped there, checked), else the
        controller's own package (a host that sees this checkout, a local subprocess)."""
        if channel is None:
            channel = gateway.remote_exec(AGENT_BOOT.format(bindings=BINDINGS))
        conn = rpyc.connect_stream(ExecnetStream(channel), service=ControllerService,
                                   config=RPYC_CONFIG)
        return cls(gateway, conn, host)  # new_lab measures the clock offset it uses

    def module(self, name: str):
        """The agent's module `name` (kept: asking for it is a round trip)."""
        mod = self._modules.get(name)
        if mod is None:
            mod = self._modules[name] = self.conn.modules[name]
        return mod

    def function(self, module: str, name: str):
        """The agent's module-level callable module.name (kept, as modules are)."""
        fn = self._functions.get((module, name))
        if fn is None:
            fn = self._functions[(module, name)] = getattr(self.module(module), name)
        return fn

    def history_after(self, since: int, wait_s: float) -> str:
        """The agent lab's records from seq `since` on as JSON lines, waiting in the agent up
        to wait_s for the first (rdmalab.agent.serve.history_after): one round trip per batch."""
        return self.function("rdmalab.agent.serve", "history_after")(self.lab, since, wait_s)

    def new_lab(self, seed: int, host: str, addresses: dict[str, str]):
        """A fresh verbs lab in the agent, its one host named as the scenario names it."""
        if self.lab is not None:
            self.close_lab()
        self.host = host
        self.sync_clock()
        # The agent's times (history, events, deadlines) on the controller's clock.
        self.lab = self.function("rdmalab.agent.serve", "open_lab")(
            seed, host, tuple(addresses.items()), self.offset_ns)
        self.labs += 1
        return self.lab

    def close_lab(self, deadline_s: float = CLOSE_DEADLINE_S) -> None:
        """Shuts the agent's lab down. A shutdown that does not return by the deadline (a
        destroy stuck in the kernel) marks the agent broken and raises Hung: its owner
        restarts the agent (in the VM lab, reboots the VM) before using it again."""
        lab, self.lab = self.lab, None
        if lab is not None:
            self.call_with_deadline(lab.shutdown, deadline_s, "lab shutdown")

    def call_with_deadline(self, fn, deadline_s: float, what: str, *args):
        """fn(*args) in the agent, waiting at most deadline_s; past it the agent is broken."""
        from ..errors import Hung  # deferred: the engine; machines import this without it
        if self.broken:
            raise Hung(f"{self.host}: {what}", f"agent {self.host} is broken: {self.broken}")
        res = rpyc.async_(fn)(*args)
        res.set_expiry(deadline_s)
        try:
            res.wait()
        except rpyc.AsyncResultTimeout:
            self.broken = f"{what} did not return within {deadline_s} s"
            raise Hung(f"{self.host}: {what}", f"agent {self.host}: {self.broken}") from None
        except EOFError as e:
            self.broken = f"the agent's channel closed during {what}: {e}"
            raise
        return res.value

    def sync_clock(self) -> None:
        """Offset of the agent's monotonic clock from ours, from the fastest of a few round
        trips (as NTP does): merged histories order records of different hosts by it."""
        clock = self.function("time", "monotonic_ns")
        best = None
        for _ in range(5):
            t0 = time.monotonic_ns()
            remote = clock()
            t1 = time.monotonic_ns()
            if best is None or t1 - t0 < best[0]:
                best = (t1 - t0, (t0 + t1) // 2 - remote)
        self.offset_ns = best[1]

    def call_copy(self, module: str, name: str, *args, deadline_s: Optional[float] = None,
                  what: str = ""):
        """A copy of module.name(*args)'s result, which must be plain data (a dict of lists,
        numbers and strings): one round trip (rdmalab.agent.serve.pickled). With deadline_s, as
        call_with_deadline."""
        fn = self.function("rdmalab.agent.serve", "pickled")
        if deadline_s is None:
            data = fn(module, name, *args)
        else:
            data = self.call_with_deadline(fn, deadline_s, what or f"{module}.{name}", module,
                                           name, *args)
        return pickle.loads(data)  # noqa: S301 - our own agent, as allow_pickle

    def call(self, module: str, name: str, *args, **kw):
        """module.name(*args, **kw) in the agent; the agent's lab replaces a lab argument."""
        return self.function(module, name)(*args, **kw)

    def close(self, deadline_s: float = CLOSE_DEADLINE_S) -> None:
        if not self.broken:
            try:
                self.close_lab(deadline_s)
            except Exception:  # the agent (or its VM) may be gone
                pass
        self._server.stop()
        _AGENTS.pop(id(self.conn), None)
        try:
            self.conn.close()
        except Exception:
            pass
        # A gateway whose peer was killed may not answer: exit it on the side, bounded.
        t = threading.Thread(target=self._exit_gateway, daemon=True)
        t.start()
        t.join(5.0)

    def _exit_gateway(self) -> None:
        try:
            self.gateway.exit()
        except Exception:
            pass


def is_remote(obj: Any) -> bool:
    return netref is not None and isinstance(obj, netref.BaseNetref)


def agent_of(obj: Any) -> Optional[Agent]:
    """The agent an object lives in (None: it is local)."""
    if not is_remote(obj):
        return None
    conn = object.__getattribute__(obj, "____conn__")
    return _AGENTS.get(id(conn))


def placement(lab, anchor) -> Optional[Agent]:
    """Where an object anchored to `anchor` (a host name, a Host, a QP, a context, ...) must be
    built: the agent it lives in, or None for here. An object that lives in an agent says so
    itself; for a host name the lab answers (Lab.place)."""
    return agent_of(anchor) or lab.place(anchor)


def build(lab, anchor, cls, *args, **kw):
    """cls(agent_lab, *args, **kw) built in the agent where `anchor` lives; None if local.
    For __new__ of classes that must sit beside their verbs objects."""
    agent = placement(lab, anchor)
    if agent is None:
        return None
    return agent.call(cls.__module__, cls.__qualname__, agent.lab, *args, **kw)


def new(cls, lab, anchor, *args, **kw):
    """For cls.__new__: the object built where `anchor` lives (then __init__ does not run
    here), or a plain new instance of cls."""
    built = build(lab, anchor, cls, *args, **kw)
    return built if built is not None else object.__new__(cls)


def obtain(obj):
    """A local copy of a remote plain value (numbers, strings, lists, dicts of them)."""
    return rpyc.classic.obtain(obj) if is_remote(obj) else obj
