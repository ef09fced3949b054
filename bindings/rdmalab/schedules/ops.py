"""The ops of a schedule (rdmalab.schedules.schedule OPS) but XRC's, as the Runner
(rdmalab.schedules.runner) takes them from Ops (`_op_<op>`): connect (the client's whole active
side, the server application accepting), recv, post, hold and release acks, disconnect, drain,
destroy, async events, kill, reboot, port down and up, rdma link delete and add, wire rules
and waits; and the
connections they make (Conn, Side). An op returns its result's detail; an expected failure
(a post on a dead QP) raises Error, a wait that must end and does not raises Hung.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from .. import ms, sec
from ..api.resources import CmSide
from ..errors import Error, Hung

# rdma_cm events that end a connect attempt (rdma_cm(7)).
_CONNECT_ENDS = ("ESTABLISHED", "REJECTED", "UNREACHABLE", "CONNECT_ERROR", "DEVICE_REMOVAL",
                 "ADDR_ERROR", "ROUTE_ERROR", "DISCONNECTED")
# The registered finding a drain on an err_post "strand" provider runs into (findings.toml).
STRANDED_FINDING = "siw-user-posts-in-error-are-never-flushed"


@dataclasses.dataclass
class Side:
    """One end of a schedule's connection: its host, process and cm_id, and once established
    its player (the QP and buffers the ops post with)."""
    conn: str
    role: str            # client | server
    host: str
    process: str
    cm_id: Any = None
    player: Any = None   # resources.CmSide once established
    holding: bool = False  # the application holds the acks of this id's events
    remote: tuple = (0, 0)  # the peer's MR (addr, rkey), exchanged once established
    closed: bool = False


@dataclasses.dataclass
class Conn:
    """A schedule's connection (a connect step's `conn`): its two sides and the listener."""
    name: str
    client: Side
    server: Side
    port: int
    listener: Any = None
    state: str = "connecting"   # connecting | established | failed
    extra: list = dataclasses.field(default_factory=list)  # requests accepted before the last


class Ops:
    """The Runner's ops; it gives lab, s, conns, port, procs, channels, dispatchers, outcome_ns,
    destroy_ns and the object helpers (_channel, _dispatcher, _bind, _side, _player, ...)."""

    def _op_connect(self, st: dict) -> str:
        c = Conn(st["conn"], Side(st["conn"], "client", st["client"],
                                  st.get("client_process", "p0")),
                 Side(st["conn"], "server", st["server"], st.get("server_process", "p0")),
                 self.port)
        self.port += 1
        self.conns[c.name] = c
        srv_ch, cli_ch = self._channel(c.server), self._channel(c.client)
        c.listener = srv_ch.listen(c.port)
        c.client.cm_id = cli_ch.connect(c.server.host, c.port, timeout_ns=self.outcome_ns)
        self._bind(c.client)
        self._serve(c)
        if c.server.cm_id is None:
            c.state = "failed"
            return "no CONNECT_REQUEST: " + self._last_event(c.client)
        self.lab.wait_until(lambda: self._ended(c.server), self.outcome_ns,
                            f"connect {c.name}: the server side's outcome")
        if c.client.cm_id.count("ESTABLISHED") and c.server.cm_id.count("ESTABLISHED"):
            for side in (c.client, c.server):
                side.player = CmSide(self.lab, side.cm_id)
                self._dispatcher(side).watch(side.player.qp, self._handler)
            # The applications exchange their buffers' address and rkey once, as they would
            # in private data: an RDMA op after the peer's MR is gone uses the stale rkey.
            c.client.remote = (c.server.player.mr.addr, c.server.player.mr.rkey)
            c.server.remote = (c.client.player.mr.addr, c.client.player.mr.rkey)
            c.state = "established"
            return "established"
        c.state = "failed"
        return f"client {self._last_event(c.client)}, server {self._last_event(c.server)}"

    def _serve(self, c: Conn) -> None:
        """The server application: accepts every CONNECT_REQUEST on the listener until the
        client's attempt has an outcome (a REQ retried after a stale REJ is a new request);
        the last one accepted is the connection's server side."""
        listener, taken = c.listener, 0
        while True:
            self.lab.wait_until(lambda: listener.count("CONNECT_REQUEST") > taken or
                                self._ended(c.client), self.outcome_ns,
                                f"connect {c.name}: a CONNECT_REQUEST or the client's outcome")
            if listener.count("CONNECT_REQUEST") <= taken:
                return
            req = listener.wait_request(sec(1))
            taken += 1
            if c.server.cm_id is not None:
                c.extra.append(c.server.cm_id)
            c.server.cm_id = req
            req.accept()
            self._bind(c.server)

    @staticmethod
    def _ended(side: Side) -> bool:
        return any(r.name in _CONNECT_ENDS for r in side.cm_id.events)

    @staticmethod
    def _last_event(side: Side) -> str:
        events = side.cm_id.events if side.cm_id is not None else []
        return events[-1].name if events else "no event"

    def _each_wr(self, st: dict):
        """A step's n WRs, a pace apart in a paced run: each post is an agent call of ms on a
        device, where a peer's TERMINATE can come between two (vm:siw seed 8)."""
        for k in range(st.get("n", 1)):
            if k and self.s.pace_ns:
                self.lab.sleep(self.s.pace_ns)
            yield k

    def _op_recv(self, st: dict) -> str:
        p = self._player(st)
        for _ in self._each_wr(st):
            p.post_recv(wr_id=self._wr(st))
        return ""

    def _op_post(self, st: dict) -> str:
        p, opcode = self._player(st), st.get("opcode", "SEND")
        kw = {"signaled": st["signaled"]} if "signaled" in st else {}
        if opcode != "SEND":
            addr, rkey = self._side(st).remote
            kw.update(remote_addr=addr, rkey=rkey)
        for _ in self._each_wr(st):
            p.post_send(opcode=opcode, wr_id=self._wr(st), **kw)
        return ""

    def _op_hold_acks(self, st: dict) -> str:
        side = self._sideof(st)
        self._channel(side).hold_acks(self._cm_id(st))
        side.holding = True
        return ""

    def _op_release_acks(self, st: dict) -> str:
        side = self._sideof(st)
        n = self._channel(side).release_acks(self._cm_id(st))
        side.holding = False
        return f"{n} acked"

    def _op_disconnect(self, st: dict) -> str:
        self._cm_id(st).disconnect()
        return ""

    def _op_drain(self, st: dict) -> str:
        player = self._player(st)
        r = player.drain(self.destroy_ns)
        if not r.complete and player.qp.ctx.caps.err_post == "strand":
            # What the provider is known to do, not a hang of the lab: a WR posted to a user
            # siw QP in ERR never completes, so no drain waiting for it can finish.
            raise Error(f"drain of {st['conn']} {st['side']}: not complete, as the finding "
                        f"{STRANDED_FINDING} predicts: {r.detail}")
        if not r.complete:
            raise Hung(f"drain of {st['conn']} {st['side']}", f"drain did not complete: "
                       f"{r.detail}\n{self.lab.dump_state()}", "drain")
        return f"{r.method}: {r.succeeded} succeeded, {r.flushed} flushed, {r.errored} errored"

    def _op_destroy(self, st: dict) -> str:
        side = self._sideof(st)
        held = side.holding  # an event read and not acked: rdma_destroy_id may not return
        self._close(side, release_acks=False)
        return "destroyed with acks held" if held else ""

    def _op_async_event(self, st: dict) -> str:
        side = self._sideof(st)
        qp = side.player.qp if side.player is not None else getattr(side.cm_id, "qp", None)
        if qp is None:
            raise Error(f"async_event: {st['conn']} {st['side']} has no QP")
        self.lab.faults.inject_async_event(side.host, st["event"], qp.qp_num,
                                           st.get("driver_delay_ns", 0))
        return ""

    def _op_kill(self, st: dict) -> str:
        self._poll_all()  # what completed before: a device's CQ goes with the process
        proc = self.procs.pop((st["host"], st["process"]), None)
        if proc is None:
            return "no such process yet"
        proc.kill()  # a later connect in that name starts the application again
        for side in self._sides():
            if (side.host, side.process) == (st["host"], st["process"]):
                side.closed = True
        self.channels.pop((st["host"], st["process"]), None)
        self.dispatchers.pop((st["host"], st["process"]), None)
        self._xrc_dead(st["host"], st["process"])
        return ""

    def _op_reboot(self, st: dict) -> str:
        self._poll_all()  # what completed before: a device's CQs go with the host (rxe seed 8)
        self.lab.faults.reboot(st["host"], st["down_ns"])
        for key in [k for k in self.procs if k[0] == st["host"]]:
            self.procs.pop(key)
            self.channels.pop(key, None)
            self.dispatchers.pop(key, None)
        for side in self._sides():
            if side.host == st["host"]:
                side.closed = True
        self._xrc_dead(st["host"])
        self._workloads_rebooted(st["host"])
        # The schedule goes on once the host is back, on every lab: a device's reboot returns
        # only then (a VM boots in tens of seconds), the model's at once (back after down_ns).
        # Without this the model's next steps met a host still down (EHOSTDOWN) that the
        # device's had back (vm:siw seed 8).
        self.lab.sleep(st["down_ns"] + ms(1))
        return ""

    def _op_port_down(self, st: dict) -> str:
        self.lab.faults.port_down(st["host"])
        return ""

    def _op_port_up(self, st: dict) -> str:
        self.lab.faults.port_up(st["host"])
        return ""

    def _op_rdma_link_delete(self, st: dict) -> str:
        self._poll_all()  # what completed before: the device's CQs go with it
        self.lab.faults.rdma_link_delete(st["host"])
        return ""

    def _op_rdma_link_add(self, st: dict) -> str:
        self.lab.faults.rdma_link_add(st["host"], st.get("deadline_ns", sec(30)) / 1e9)
        return ""

    def _op_rule(self, st: dict) -> str:
        self.rules[st["name"]] = self.lab.faults.rule(dict(st["rule"]))
        return ""

    def _op_unrule(self, st: dict) -> str:
        rule = self.rules.pop(st["name"], None)
        if rule is not None:
            self.lab.faults.remove(rule)
        return ""

    def _op_wait(self, st: dict) -> str:
        self.lab.sleep(st["ns"])
        self._poll_all()
        return ""

    def _poll_all(self) -> None:
        """Reads every live side's completions: a device records a completion when it is
        polled (the model when it is made), so an application that polls is what makes the
        two histories comparable."""
        for side in self._sides():
            self._poll(side)
        self._xrc_poll_all()

    def _poll(self, side: Side) -> None:
        if side.closed or side.player is None:
            return
        try:
            while side.player.poll(32):
                pass
        except Error:
            pass
