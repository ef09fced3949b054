"""Every posted WR completes exactly once, or is unknown with a reason (Jepsen's pending op).

A WR is a `post` record ((host, object) "qp:N" or "srq:N", queue send/recv/srq, wr_id); its
completion a `wc` or `wc_lost` record (a CQE the CQ had no room for still ended the WR). WRs
are keyed by host and QP object, never by qp_num alone: a reboot or a destroy hands a QPN out
again, and the model's labels are never reused (a device's label after a reboot starts a new
object at its ibv_create_qp). A wc whose object is not a QP (the verbs backend names the CQ
for a QP it no longer knows) is matched through (host, qp_num) to the latest QP with it.

Invalid: a completion for a WR already completed (twice), a completion for a WR never posted,
and, on the model only, a signaled WR still outstanding more than FLUSH_GRACE_NS after its QP
entered ERR (or after it was posted to a QP in ERR) while the device lived: IBA 10.3.1 / the
model's QpCore::flush_now complete every outstanding WR with WR_FLUSH_ERR, and the model
records a wc when the CQE is made (core/model/resources.cc ModelCq::push), at once
(schedule_flush runs after 0 ns). A device's history records a wc only when it is polled,
so there a missing flush is unknown, never invalid.

STRANDED: a WR posted to a QP already in ERR, or a send posted in iWARP CLOSING (SQD), on a
host whose provider strands such posts (caps.err_post "strand", user-space siw: finding
siw-user-posts-in-error-are-never-flushed; docs/semantics.md J; Context.err_posts) is expected
to get no completion: settled, neither invalid nor unknown (a completion that does come is still
checked for being the only one). A receive posted in CLOSING is flushed at the move to ERR.

Unsignaled sends (signaled false): ibv_create_qp(3) sq_sig_all / ibv_post_send(3)
IBV_SEND_SIGNALED: a WR without the flag makes no completion when it succeeds. In error the
model flushes every outstanding WR, signaled or not (qp.cc flush_now), but an unsignaled WR
that already succeeded silently is no longer outstanding (acknowledged; siw: handed to TCP) and
gets nothing, and docs/semantics.md C calls unsignaled flushes vendor-dependent. So an
unsignaled send needs no wc: one that comes is its completion (a second is invalid), and a
later completion on its send queue settles it (completions of a work queue come in posting
order); one with neither is neither judged nor unknown.

Unknown, with the reason, for a WR with no completion when: its QP was destroyed (verb,
lab close), moved to RESET (WRs are removed without completions), its process was killed,
its host rebooted or was lost, its device died (no flush from a dead device), it still sat in
its SRQ, or the history ended (or, on a device, no wc was polled for it). On a device a
receive completion with no post on a QP that had no receives of its own is unknown too: the
verbs backend records no SRQ post (core/verbs/objects.cc VerbsSrq::post_recv).
"""
from __future__ import annotations

from .base import INVALID, UNKNOWN, Context, Result

NAME = "completions"
FLUSH_GRACE_NS = 1_000_000   # the model flushes at once; 1 ms of virtual time is ample

_KINDS = frozenset({"qp_state", "verb", "destroyed_by_kill",
                    "destroyed_by_close", "fault", "host_lost", "process_crash",
                    "device_disassociate", "device_removed"})
_DESTROY_VERBS = frozenset({"ibv_destroy_qp", "ibv_destroy_srq"})


class _Wr:
    __slots__ = ("seq", "t", "queue", "signaled", "wr_id", "key", "done", "stranded")

    def __init__(self, seq: int, t: int, queue: str, signaled: bool, wr_id, key: tuple):
        self.seq, self.t, self.queue, self.wr_id, self.key = seq, t, queue, wr_id, key
        self.signaled = signaled or queue != "send"
        self.done = None          # the seq of what settled it
        self.stranded = False     # posted where its provider strands it (STRANDED)


class _Queue:
    """One QP's (or SRQ's) outstanding WRs and what it has settled."""
    __slots__ = ("pending", "unsig", "done", "err_t", "closing", "dead", "srq", "rq")

    def __init__(self, srq: bool = False):
        self.pending: dict = {}    # wr_id -> [_Wr] in posting order
        self.unsig: list = []      # outstanding unsignaled sends, in posting order
        self.done: dict = {}       # wr_id -> seq of the record that settled the last one
        self.err_t = None          # t_ns it entered ERR, while in ERR
        self.closing = False       # in SQD on iWARP: RDMAC CLOSING
        self.dead = False          # its device died: no flush will come
        self.srq = srq
        self.rq = False            # receives were posted to it (not an SRQ's QP)


class _Check:
    def __init__(self, ctx: Context):
        self.model = bool(ctx.personality)
        self.ctx, self.err_posts = ctx, ctx.err_posts
        self.res = Result(NAME)
        self.q: dict = {}            # (host, object) -> _Queue
        self.qpn: dict = {}          # (host, qp_num) -> latest QP object
        self.srqs: dict = {}         # host -> [srq object]
        self.early: dict = {}        # device: (key, wr_id) -> (wc seq, receive?) before a post
        self.killed_hosts: set = set()
        self.reboot_t: dict = {}     # host -> t_ns of its last reboot
        self.unknown: list = []      # (reason, _Wr)
        self.stranded = 0            # WRs posted in ERR on an err_post "strand" host
        self.posted = 0
        self.t_end = 0

    # -- the pass (posts and completions are most records: they skip the dispatch)
    def run(self, history: list) -> Result:
        on = {k: getattr(self, "on_" + k) for k in _KINDS}
        post, wc = self.on_post, self.on_wc
        for r in history:
            k = r["kind"]
            if k == "post":
                post(r)
            elif k == "wc" or k == "wc_lost":
                wc(r)
            else:
                f = on.get(k)
                if f is not None:
                    f(r, r["data"])
        if history:
            self.t_end = history[-1]["t_ns"]
        self.finish()
        return self.res

    def new_queue(self, key: tuple, qp_num) -> _Queue:
        q = self.q[key] = _Queue(key[1].startswith("srq:"))
        if q.srq:
            self.srqs.setdefault(key[0], []).append(key[1])
        elif qp_num is not None:
            self.qpn[(key[0], qp_num)] = key[1]
        return q

    def on_post(self, r):
        d = r["data"]
        key = (r["host"], r["object"])
        q = self.q.get(key) or self.new_queue(key, d.get("qp_num"))
        wr_id = d["wr_id"]
        w = _Wr(r["seq"], r["t_ns"], d["queue"], d.get("signaled", True), wr_id, key)
        w.stranded = self.err_posts.get(key[0]) == "strand" and (
            q.err_t is not None or (q.closing and w.queue == "send"))
        self.posted += 1
        if self.early:
            early = self.early.pop((key, wr_id), None)
            if early is not None:      # a device's poll beat the post's record
                w.done = q.done[wr_id] = early[0]
                return
        lst = q.pending.get(wr_id)
        if lst is None:
            q.pending[wr_id] = [w]
        else:
            lst.append(w)
        if not w.signaled:
            q.unsig.append(w)
        elif w.queue == "recv":
            q.rq = True

    def on_wc(self, r):
        d = r["data"]
        host, obj = r["host"], r["object"]
        if not obj.startswith("qp:"):
            obj = self.qpn.get((host, d.get("qp_num")), obj)
        key = (host, obj)
        q = self.q.get(key)
        wr_id = d.get("wr_id")
        recv = str(d.get("opcode", "")).startswith("RECV")
        w = self.take(q, wr_id, recv, d.get("status") == "SUCCESS") if q else None
        if w is None and (recv or d.get("status") != "SUCCESS"):
            srq, w = self.take_srq(host, wr_id)
            if w is not None:
                q = srq
        if w is None:
            return self.stray(r, key, wr_id, q)
        w.done = q.done[wr_id] = r["seq"]
        if q.unsig and w.queue == "send":
            self.settle_earlier(q, w, r["seq"])

    @staticmethod
    def take(q: _Queue, wr_id, recv: bool, success: bool):
        """The oldest outstanding WR with this wr_id; on success of the queue the opcode
        names (a failed wc's opcode is not valid, ibv_poll_cq(3))."""
        lst = q.pending.get(wr_id)
        if not lst:
            return None
        for i, w in enumerate(lst):
            if not success or (w.queue != "send") == recv:
                del lst[i]
                if not lst:
                    del q.pending[wr_id]
                if not w.signaled:
                    q.unsig.remove(w)
                return w
        return None

    def take_srq(self, host: str, wr_id):
        for obj in self.srqs.get(host, ()):
            q = self.q[(host, obj)]
            w = self.take(q, wr_id, True, False)
            if w is not None:
                return q, w
        return None, None

    def settle_earlier(self, q: _Queue, w: _Wr, seq: int) -> None:
        """Unsignaled sends posted before w on its send queue ended before it (in order)."""
        keep = []
        for u in q.unsig:
            if u.seq < w.seq:
                u.done = q.done[u.wr_id] = seq
                lst = q.pending[u.wr_id]
                lst.remove(u)
                if not lst:
                    del q.pending[u.wr_id]
            else:
                keep.append(u)
        q.unsig[:] = keep

    def stray(self, r: dict, key: tuple, wr_id, q) -> None:
        seq = r["seq"]
        where = dict(host=key[0], object=key[1])
        before = q.done.get(wr_id) if q else None
        if before is None:
            for obj in self.srqs.get(key[0], ()):
                before = self.q[(key[0], obj)].done.get(wr_id)
                if before is not None:
                    break
        if before is not None:
            self.res.fail(f"wr_id {wr_id} completed twice ({r['kind']} "
                          f"{r['data'].get('status')} after record {before})",
                          (before, seq), **where)
        elif not self.model:
            self.early[(key, wr_id)] = (seq, str(r["data"].get("opcode", "")).startswith("RECV"))
        else:
            self.res.fail(f"{r['kind']} for wr_id {wr_id}, which was never posted "
                          f"(status {r['data'].get('status')})", (seq,), **where)

    def on_qp_state(self, r, d):
        host, obj = r["host"], r["object"]
        if "qp_num" in d:
            self.qpn[(host, d["qp_num"])] = obj
        # A QP's state before its first post matters too: a WR posted to a QP already in ERR
        # (or CLOSING) is judged by it.
        q = self.q.get((host, obj)) or self.new_queue((host, obj), d.get("qp_num"))
        to = d.get("to")
        q.closing = to == "SQD" and self.ctx.transport(host) == "iWARP"
        if "device fatal" in str(d.get("why", "")):
            q.dead = True
        if to == "ERR":
            if q.err_t is None:
                q.err_t = r["t_ns"]
            return
        if q.err_t is not None:
            self.overdue(q, r["t_ns"], r["seq"])
            q.err_t = None
        if to == "RESET":
            self.retire(q, "its QP was reset (WRs are removed without completions)")

    def on_verb(self, r, d):
        v = d.get("verb")
        if v == "ibv_create_qp":
            key = (r["host"], r["object"])
            if "qp_num" in d:
                self.qpn[(key[0], d["qp_num"])] = key[1]
            if key in self.q:      # a device's label reused after a reboot: a new QP
                self.retire(self.q.pop(key), "its QP was replaced")
        elif v in _DESTROY_VERBS and not d.get("open_handle") and "err" not in d:
            self.ended(r, "its QP was destroyed before a completion was seen")

    def on_destroyed_by_close(self, r, d):
        self.ended(r, "its QP was destroyed (the lab closed it) before a completion")

    def on_destroyed_by_kill(self, r, d):
        host = r["host"]
        why = "its host rebooted" if self.reboot_t.get(host) == r["t_ns"] \
            else "its process was killed"
        self.ended(r, why)

    def ended(self, r: dict, why: str) -> None:
        q = self.q.get((r["host"], r["object"]))
        if q is None:
            return
        if q.err_t is not None:
            self.overdue(q, r["t_ns"], r["seq"])
        what = "SRQ" if q.srq else "QP"
        self.retire(q, why.replace("QP", what))

    def on_fault(self, r, d):
        f = d.get("fault")
        host = r["host"]
        if f == "reboot":
            self.reboot_t[host] = r["t_ns"]
            self.host_gone(r, "its host rebooted")
        elif f == "kill":
            self.killed_hosts.add(host)
        elif f == "device_fatal":
            self.device_dead(r)

    def on_process_crash(self, r, d):
        self.killed_hosts.add(r["host"])

    def on_host_lost(self, r, d):
        self.host_gone(r, "its host was lost")

    def on_device_disassociate(self, r, d):
        self.device_dead(r)

    on_device_removed = on_device_disassociate

    def host_gone(self, r: dict, why: str) -> None:
        host = r["host"]
        for key, q in self.q.items():
            if key[0] == host:
                if q.err_t is not None:
                    self.overdue(q, r["t_ns"], r["seq"])
                    q.err_t = None
                self.retire(q, why)

    def device_dead(self, r: dict) -> None:
        for key, q in self.q.items():
            if key[0] == r["host"] and not q.dead:
                if q.err_t is not None:
                    self.overdue(q, r["t_ns"], r["seq"])
                q.dead = True

    def overdue(self, q: _Queue, t: int, seq: int) -> None:
        """Model only: signaled WRs outstanding in ERR past the grace lost their flush."""
        if not self.model or q.dead or q.srq:
            return
        for lst in q.pending.values():
            for w in lst:
                if not w.signaled or w.done is not None:
                    continue
                due = max(w.t, q.err_t)
                if w.stranded:
                    w.done = seq  # stranded, as its provider does (STRANDED below)
                    self.stranded += 1
                    continue
                if t - due > FLUSH_GRACE_NS:
                    w.done = seq      # judged: not unknown as well
                    self.res.fail(
                        f"wr_id {w.wr_id} ({w.queue}, posted at record {w.seq}) got no "
                        f"completion in {(t - due) / 1e6:.3f} ms of its QP in ERR "
                        f"(every outstanding WR is flushed, IBA 10.3.1)", (w.seq, seq),
                        host=w.key[0], object=w.key[1])

    def retire(self, q: _Queue, why: str) -> None:
        for lst in q.pending.values():
            for w in lst:
                if w.signaled and w.done is None:
                    self.unknown.append((why, w))
        q.pending.clear()
        q.unsig.clear()

    def finish(self) -> None:
        res = self.res
        for (key, wr_id), (seq, recv) in self.early.items():
            q = self.q.get(key)
            if recv and (q is None or not q.rq):
                # A QP with no receives of its own takes them from an SRQ, and the verbs
                # backend records no SRQ post (core/verbs/objects.cc VerbsSrq::post_recv).
                self.unknown.append(("a receive completion with no post record (a device "
                                     "history has no SRQ posts)",
                                     _Wr(seq, 0, "recv", True, wr_id, key)))
                continue
            res.fail(f"wc for wr_id {wr_id}, which was never posted", (seq,), host=key[0],
                     object=key[1])
        for (host, _), q in self.q.items():
            if q.srq:
                why = "still in its SRQ at the end of the history"
            elif q.dead:
                why = "its device died (a dead device makes no flush completions)"
            elif not self.model:
                why = ("a process on its host was killed (a device history does not say "
                       "which objects it held)" if host in self.killed_hosts else
                       "no wc by the end of the history (a device's wc is recorded when "
                       "polled)")
            else:
                why = "still outstanding at the end of the history"
            if q.err_t is not None:
                self.overdue(q, self.t_end, -1)
            self.retire(q, why)
        res.checked = self.posted
        if self.unknown and res.verdict != INVALID:
            res.verdict = UNKNOWN
        if self.unknown:
            res.reason = _summary(self.unknown)


def _summary(unknown: list) -> str:
    by: dict = {}
    for why, w in unknown:
        by.setdefault(why, []).append(w)
    parts = []
    for why, ws in by.items():
        shown = ", ".join(f"{w.key[0]}/{w.key[1]} wr_id {w.wr_id}" for w in ws[:3])
        more = f" and {len(ws) - 3} more" if len(ws) > 3 else ""
        parts.append(f"{len(ws)} WR{'s' if len(ws) > 1 else ''} with no completion: {why} "
                     f"({shown}{more})")
    return "; ".join(parts)


def check(history: list, ctx: Context) -> Result:
    return _Check(ctx).run(history)
