"""Seed 003 (Jack Morgenstein, 2007): the XRC receive (TGT) QP must outlive the process that
created it.

On host b a "creator" process opens the XRC domain by path and creates the TGT QP; a "worker"
process opens the same domain and receives on its own XRC SRQ. Host a sends to the worker's
SRQ through the TGT QP. The creator is then SIGKILLed.

Lifetime rules (semantics.md D): "handle" (today's kernel: the TGT QP lives while any process
holds a handle on it) and "xrcd" (2007 proposal / 2011 commit: it lives until the domain's last
reference). A device whose rule is unknown (a real one) reports which rule it showed.
"""

import pytest

from rdmalab import Error, ms, sec
from rdmalab.api.cm_timing import late_span_bound_ns, stood_still
from rdmalab.api.resources import XrcSender
from rdmalab.api.stack import Traffic, bring_up, endpoint_values, local_endpoint

pytestmark = pytest.mark.requires("xrc")

PATH = "/tmp/rdmalab-seed003-xrcd"
SENDER_PARAMS = {"timeout": 10, "retry_cnt": 3}  # 4 tries of 4.096 us * 2^10 = 4.2 ms each
# A send to a vanished TGT QP ends in RETRY_EXC_ERR after (retry_cnt + 1) transport timeouts.
RETRY_BOUND_NS = (SENDER_PARAMS["retry_cnt"] + 1) * 4096 * 2 ** SENDER_PARAMS["timeout"] + ms(5)
ROUND = 4  # messages per round


class XrcSetup:
    def __init__(self, lab, worker_opens_qp: bool):
        b = lab.host("b")
        self.lab = lab
        self.creator = b.process("creator")
        cctx = self.creator.open_device()
        self.creator_xrcd = cctx.open_xrcd(PATH, create=True)
        self.tgt = cctx.create_qp(None, "XRC_RECV", xrcd=self.creator_xrcd)
        self.tgt_qpn = self.tgt.qp_num

        self.worker = b.process("worker")
        self.wctx = self.worker.open_device()
        self.wxrcd = self.wctx.open_xrcd(PATH, create=False)
        pd = self.wctx.alloc_pd()
        self.cq = self.wctx.create_cq(256)
        self.mr = self.wctx.reg_mr(pd, 4096)
        self.srq = self.wctx.create_srq_xrc(pd, self.wxrcd, self.cq, max_wr=128)
        self.srq_num = self.srq.srq_num  # the sender's agent gets a number, not a proxy
        self.handle = self.wctx.open_qp(self.wxrcd, self.tgt_qpn) if worker_opens_qp else None
        self.rx = Traffic(lab, "b")
        self.rx.post_srq_recv(self.srq, sge=self.mr.sge(0, 64), count=64)

        self.sender = XrcSender(lab, "a")
        ep_s = endpoint_values(self.sender.endpoint)  # values: one round trip each
        ep_t = endpoint_values(local_endpoint(self.tgt, 0x300))
        bring_up(self.sender.qp, ep_s, ep_t, SENDER_PARAMS)
        bring_up(self.tgt, ep_t, ep_s, SENDER_PARAMS)

    def send_round(self):
        """Sends ROUND messages to the worker's SRQ; returns the sender's new completions."""
        before = self.sender.traffic.completions()
        self.sender.post_send(self.srq_num, length=64, count=ROUND)
        self.sender.wait_completions(ROUND if self.sender.qp.state == "RTS" else 1,
                                     timeout_ns=RETRY_BOUND_NS * 2)
        return self.sender.traffic.completions()[len(before):]

    def worker_received(self) -> int:
        self.rx.poll(self.cq, 64)
        return sum(1 for wc in self.rx.completions() if wc.status == "SUCCESS")


def rule_of(lab, caps) -> str:
    return caps.xrc_tgt_lifetime


def test_senders_keep_reaching_the_srq_after_the_creator_dies(lab):
    s = XrcSetup(lab, worker_opens_qp=True)
    assert all(wc.status == "SUCCESS" for wc in s.send_round())
    assert s.worker_received() == ROUND

    s.creator.kill()
    assert not s.creator.alive
    assert s.tgt.destroyed  # the creator's handle went with it

    wcs = s.send_round()
    assert [wc.status for wc in wcs] == ["SUCCESS"] * ROUND, "TGT QP died with its creator"
    assert s.worker_received() == 2 * ROUND
    assert s.handle.state == "RTR"  # the worker's handle still sees the real QP


def test_creator_killed_with_no_other_handle(lab):
    s = XrcSetup(lab, worker_opens_qp=False)
    caps = s.wctx.caps
    assert all(wc.status == "SUCCESS" for wc in s.send_round())

    t_kill = lab.now_ns
    s.creator.kill()
    wcs = s.send_round()
    statuses = [wc.status for wc in wcs]
    observed = "handle" if "RETRY_EXC_ERR" in statuses else "xrcd"
    lab.record("finding", object="xrc", host="b", rule=observed, statuses=statuses)

    if caps.xrc_tgt_lifetime == "handle":
        # Today's rule: the last handle went with the creator, so the TGT QP is gone even
        # though the worker still holds the domain; the sender retries, then gives up.
        assert statuses[0] == "RETRY_EXC_ERR", statuses
        assert all(st in ("RETRY_EXC_ERR", "WR_FLUSH_ERR") for st in statuses)
        t_end = lab.now_ns
        bound = late_span_bound_ns(lab, ("a", "b"), t_kill, t_end, RETRY_BOUND_NS * 2)
        assert t_end - t_kill <= bound, \
            f"RETRY_EXC_ERR {(t_end - t_kill) / 1e6:.1f} ms after the kill; at most " \
            f"{bound / 1e6:.1f} ms (twice the retry budget + tolerance + stall: " \
            f"{stood_still(lab, ('a', 'b'), t_kill, t_end)})"
        assert s.worker_received() == ROUND
        with pytest.raises(Error) as err:
            s.wctx.open_qp(s.wxrcd, s.tgt_qpn)
        assert err.value.verb == "ibv_open_qp"
    elif caps.xrc_tgt_lifetime == "xrcd":
        # Legacy rule: the worker's domain reference keeps the TGT QP; traffic flows on.
        assert statuses == ["SUCCESS"] * ROUND, statuses
        assert s.worker_received() == 2 * ROUND
        # ... until the last reference to the domain goes.
        s.worker.kill()
        s.sender.traffic.completions()
        wcs = s.send_round()
        assert wcs and wcs[0].status == "RETRY_EXC_ERR", [wc.status for wc in wcs]
    else:
        assert observed in ("handle", "xrcd")


def test_last_close_cleans_everything_up(lab):
    s = XrcSetup(lab, worker_opens_qp=True)
    assert all(wc.status == "SUCCESS" for wc in s.send_round())
    s.creator.kill()
    # The worker closes in the order an orderly program would.
    s.handle.destroy()
    s.srq.destroy()
    s.wxrcd.close()
    assert s.handle.destroyed and s.srq.destroyed and s.wxrcd.destroyed

    # The TGT QP is gone: its QPN answers nobody, and a new process cannot open it.
    wcs = s.send_round()
    assert wcs and wcs[0].status == "RETRY_EXC_ERR", [wc.status for wc in wcs]
    late = lab.host("b").process("late")
    lctx = late.open_device()
    xrcd = lctx.open_xrcd(PATH, create=True)  # a new, empty domain on the same inode
    with pytest.raises(Error) as err:
        lctx.open_qp(xrcd, s.tgt_qpn)
    assert err.value.verb == "ibv_open_qp"
    xrcd.close()
    state = lab.dump_state()
    assert f"qpn {s.tgt_qpn} XRC_RECV" not in state, state


def test_xrcd_shared_by_path_follows_open_flags(lab):
    ctx = lab.host("b").process("p").open_device()
    x1 = ctx.open_xrcd(PATH + "-flags", create=True)
    with pytest.raises(Error) as err:
        ctx.open_xrcd(PATH + "-flags", create=True, excl=True)
    assert err.value.errno_name == "EEXIST"
    x2 = ctx.open_xrcd(PATH + "-flags", create=False)
    assert x2.id != x1.id
    x2.close()
    x1.close()
