"""The labs the workloads' unit tests fake (test_py_workloads, _iser, _srp, _nfs): HostLab,
what a workload's host side asks of its agent's lab; UlpLab, what a workload's controller side
asks of a lab with kernel ULPs."""

import threading
from types import SimpleNamespace


class HostLab:
    """The agent's lab on one host: its name, records (thread-safe: watchers and the ledger
    write from threads of their own), closers."""

    def __init__(self, host="b"):
        self.hosts = {host: object()}
        self.records: list[dict] = []
        self.closers = []
        self._lock = threading.Lock()

    def record(self, kind, object="scenario", host="", **data):
        with self._lock:
            self.records.append({"kind": kind, "object": object, "host": host, **data})

    def add_closer(self, fn):
        self.closers.append(fn)

    def kinds(self, kind):
        return [r for r in self.records if r["kind"] == kind]


class UlpLab:
    """A lab with kernel ULPs and hosts a and b, whose hosts answer boot_id (kernels of their
    own, or one) and every other host call with `answers[function]` (a callable: called with
    the host); the calls are kept as (host, module, function, args)."""
    description = "fake"

    def __init__(self, one_kernel=False, answers=None, device=("rxe0", "RoCEv2")):
        self.one_kernel, self.answers, self.calls = one_kernel, answers or {}, []
        caps = SimpleNamespace(name=device[0], transport=device[1])
        self._host = SimpleNamespace(caps=lambda: caps)

    def has(self, capability):
        return True

    def host(self, name):
        if name not in ("a", "b"):
            raise KeyError(f"no host {name!r}; hosts: a, b")
        return self._host

    def address_of(self, host):
        return {"a": "10.0.0.1", "b": "10.0.0.2"}[host]

    def run_on(self, host, module, function, *args, deadline_s):
        if function == "boot_id":
            assert module == "rdmalab.workloads.host", module
            return {"boot_id": "one" if self.one_kernel else host}
        self.calls.append((host, module, function, args))
        got = self.answers[function]
        return got(host) if callable(got) else got
