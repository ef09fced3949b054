"""NetnsHosts: the netns lab, n namespaces behind one bridge on an outer Machine (made, checked
for leftovers of an earlier lab, and taken down again), and kernel_support: whether the outer's
kernel can host it."""
from __future__ import annotations

import re
from typing import Optional

from ..machine import Machine, MachineError
from .capture import BridgeCapture
from .common import (CMD_TIMEOUT_S, MAX_HOSTS, MODULES, NETNS_SINCE, RDMA_KINDS, SBIN_PATH,
                     links, netns_list, run_steps)
from .host import NetnsMachine


class NetnsHosts:
    """The netns lab's source of machines: n namespaces behind one bridge on `outer`.

        with NetnsHosts(LocalMachine(), 2, "rxe") as lab:
            a, b = lab.machines
    """

    def __init__(self, outer: Machine, n: int, rdma: str = "rxe", prefix: str = "rl",
                 subnet: str = "10.77.0", *, replace: bool = False,
                 netns_mode: str = "shared", ready_deadline_s: float = 60.0):
        if not 1 <= n <= MAX_HOSTS:
            raise ValueError(f"netns lab: {n} hosts: 1 to {MAX_HOSTS}")
        if rdma not in RDMA_KINDS:
            raise ValueError(f"netns lab: rdma {rdma!r}: one of {', '.join(RDMA_KINDS)}")
        # Ends in a letter: <prefix><i> must not read as another prefix's host.
        if not re.fullmatch(r"[a-z]([a-z0-9]{0,8}[a-z])?", prefix):
            raise ValueError(f"netns lab: prefix {prefix!r}: 1-10 of [a-z0-9], starting and "
                             f"ending with a letter (interface names are 15 characters)")
        if not re.fullmatch(r"(\d{1,3})\.(\d{1,3})\.(\d{1,3})", subnet) or \
                any(int(o) > 255 for o in subnet.split(".")):
            raise ValueError(f"netns lab: subnet {subnet!r}: three octets, as 10.77.0")
        if netns_mode not in ("shared", "exclusive"):
            raise ValueError(f"netns lab: netns_mode {netns_mode!r}: shared or exclusive")
        self.outer, self.rdma, self.prefix, self.subnet = outer, rdma, prefix, subnet
        self.netns_mode = netns_mode
        self.bridge = f"{prefix}br"
        self.machines: list[NetnsMachine] = []
        self._started: list[NetnsMachine] = []   # what close() must take down
        self._bridge_made = False
        try:
            self._setup(n, replace, ready_deadline_s)
        except BaseException as e:
            try:
                self.close()
            except MachineError as ce:
                e.add_note(f"cleaning up after the failed setup also failed: {ce}")
            raise

    def _setup(self, n: int, replace: bool, ready_deadline_s: float) -> None:
        where = f"{self.outer.name}: netns lab {self.prefix}"
        ip = run_steps(self.outer, where, [("find ip (iproute2)", "command -v ip")]
                        ).out.strip().splitlines()[-1]
        self.machines = [NetnsMachine(self.outer, self.prefix, i, rdma=self.rdma,
                                      subnet=self.subnet, ip=ip) for i in range(1, n + 1)]
        left = self.leftovers()
        if left and not replace:
            raise MachineError(f"{where}: already exist: {', '.join(left)} (a lab of this "
                               f"prefix is running, or one was not closed; another prefix, "
                               f"or replace=True to delete them)")
        for name in left:
            if re.fullmatch(rf"{self.prefix}\d+", name):   # a namespace: as a crash of it
                m = NetnsMachine(self.outer, self.prefix, int(name[len(self.prefix):]),
                                 rdma=self.rdma, subnet=self.subnet, ip=ip)
                m._destroy()
        links = [(f"delete the leftover link {name}", f"ip link del {name}")
                 for name in self.leftovers()]
        if links:
            run_steps(self.outer, where, links)
        if self.rdma != "none":
            self._rdma_system()
        run_steps(self.outer, where, [
            (f"create the bridge {self.bridge}", f"ip link add {self.bridge} type bridge"),
        ])
        self._bridge_made = True
        run_steps(self.outer, where, [(f"bring the bridge {self.bridge} up",
                                        f"ip link set {self.bridge} up")])
        for m in self.machines:
            self._started.append(m)
            m._create()
        for m in self.machines:
            m.wait_ready(ready_deadline_s)

    def _rdma_system(self) -> None:
        where = f"{self.outer.name}: netns lab {self.prefix}"
        mod, mode = MODULES[self.rdma], self.netns_mode
        r = run_steps(self.outer, where, [
            (f"load {mod}", f"[ -d /sys/module/{mod} ] || modprobe {mod}"),
            ("read the RDMA namespace mode (rdma system show)", "rdma system show"),
        ])
        if f"netns {mode}" in r.out:
            return
        # Only while no namespace but the initial one exists (rdma_compatdev_set: EBUSY).
        run_steps(self.outer, where, [(
            f"set the RDMA namespace mode to {mode} (possible only while no other network "
            f"namespace exists: see `lsns -t net`)", f"rdma system set netns {mode}")])

    def leftovers(self) -> list[str]:
        """Namespaces, veths and the bridge of this prefix that exist on the outer machine."""
        pat = re.compile(rf"{re.escape(self.prefix)}(\d+|\d+v|br)")
        return sorted(n for n in netns_list(self.outer) + links(self.outer) if pat.fullmatch(n))

    def close(self) -> None:
        """Tears down what this lab made (processes killed, devices, namespaces, veths, the
        bridge); idempotent. Every host is tried; the errors come back together."""
        errors = []
        BridgeCapture.close_all(self.outer, self.bridge)  # before its bridge goes
        for m in self.machines:
            m.retired = True
        while self._started:
            m = self._started.pop()
            try:
                m._destroy()
            except MachineError as e:
                errors.append(str(e))
        if self._bridge_made:
            try:
                run_steps(self.outer, f"{self.outer.name}: netns lab {self.prefix}", [(
                    f"delete the bridge {self.bridge}",
                    f"{{ ! ip link show {self.bridge} >/dev/null 2>&1 || "
                    f"ip link del {self.bridge}; }}")])
                self._bridge_made = False
            except MachineError as e:
                errors.append(str(e))
        if errors:
            raise MachineError("closing the netns lab: " + "\n".join(errors))

    def __enter__(self) -> "NetnsHosts":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def kernel_support(outer: Machine, rdma: str = "rxe") -> Optional[str]:
    """None when outer's kernel can host the netns lab with `rdma` ("rxe", "siw", "none"),
    else a sentence saying why, naming the kernel release."""
    mod = MODULES.get(rdma)
    probe = (SBIN_PATH + "uname -r; "
             "command -v ip >/dev/null && echo have-ip; "
             "command -v rdma >/dev/null && echo have-rdma; "
             "[ -e /proc/self/ns/net ] && echo have-netns; ")
    if mod:
        probe += (f"{{ [ -d /sys/module/{mod} ] || modprobe -n {mod} >/dev/null 2>&1; }} "
                  f"&& echo have-module")
    try:
        # Not as root: the release is named even where root is what is missing.
        r = outer.run(probe, timeout=CMD_TIMEOUT_S)
        lines = r.out.split()
        if r.timed_out or not lines:
            return (f"{outer.name}: the kernel probe failed (rc {r.rc}): "
                    f"{(r.err or r.out).strip()[-300:]}")
        release, why = lines[0], []
        try:
            uid = outer.run("id -u", timeout=CMD_TIMEOUT_S, root=True)
            if uid.out.strip() != "0":
                why.append(f"commands there do not run as root (id -u: rc {uid.rc}, "
                           f"{(uid.out + uid.err).strip()[-200:]})")
        except OSError as e:    # LocalMachine without sudo
            why.append(f"commands there cannot run as root ({e})")
    except MachineError as e:
        return f"{outer.name} did not answer the kernel probe: {e}"
    if "have-netns" not in lines:
        why.append("it has no network namespaces (/proc/self/ns/net)")
    missing = [t for t in ("ip",) + (("rdma",) if mod else ()) if f"have-{t}" not in lines]
    if missing:
        why.append(f"{' and '.join(missing)} missing (Debian package iproute2)")
    if mod:
        if "have-module" not in lines:
            why.append(f"the {mod} module is not available (no /sys/module/{mod}, "
                       f"`modprobe -n {mod}` fails)")
        m = re.match(r"(\d+)\.(\d+)", release)
        if not m or (int(m[1]), int(m[2])) < NETNS_SINCE:
            why.append(f"{rdma} works per network namespace only since "
                       f"{NETNS_SINCE[0]}.{NETNS_SINCE[1]} (\"RDMA/rxe: Add the support that "
                       f"rxe can work in net namespace\")")
    if not why:
        return None
    return (f"{outer.name}'s kernel {release} cannot host the netns lab with {rdma}: "
            + "; ".join(why))
