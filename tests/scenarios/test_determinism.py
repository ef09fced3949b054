"""One seed replays one run: the same seed gives a byte-identical history (TigerBeetle's VOPR,
FoundationDB's simulator). Only a backend with a seeded clock can promise this, so the test
asks the lab whether it replays rather than which backend it is."""

import json

import pytest

from rdmalab import ms, sec
from rdmalab.api.resources import RCPair
from rdmalab.api.stack import Dispatcher

LOSSY = {"loss_ppm": 20000, "jitter_ns": 3000}  # 2% loss and jitter: the seed decides a lot


def workload(lab):
    lab.faults.fabric(**LOSSY)
    pair = RCPair(lab, max_send_wr=64, max_recv_wr=64, cqe=256, params={"timeout": 8})
    with Dispatcher(lab, pair.a.ctx) as d:
        d.watch(pair.a.qp, lambda ev: lab.sleep(ms(1)))
        pair.b.post_recv(length=64, count=32)
        pair.a.post_send(length=64, count=32)
        pair.a.wait_completions(16, timeout_ns=sec(1))
        if "QP_FATAL" in pair.a.ctx.caps.raises:
            lab.faults.inject_async_event("a", "QP_FATAL", pair.a.qp.qp_num)
        pair.a.drain(timeout_ns=sec(1), dispatcher=d)
        d.destroy(pair.a.qp)
    return lab.history()


def run(lab_factory, seed):
    lab = lab_factory(seed=seed)
    if not lab.replayable:
        pytest.skip(f"{lab.description} has no virtual_time (a seeded clock): histories cannot replay")
    try:
        return workload(lab)
    finally:
        lab.shutdown()


def test_same_seed_gives_identical_history(lab_factory):
    first, second = run(lab_factory, 11), run(lab_factory, 11)
    assert len(first) > 100
    assert [json.dumps(r, sort_keys=True) for r in first] == \
        [json.dumps(r, sort_keys=True) for r in second]


def test_other_seed_gives_another_history(lab_factory):
    assert run(lab_factory, 11) != run(lab_factory, 12)
