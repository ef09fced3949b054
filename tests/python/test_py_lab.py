"""The Lab wrapper over the model: identity, time, waits and their dump, history, threads."""

import errno
import json

import pytest

import rdmalab
from rdmalab import ms, us


@pytest.fixture
def mlab():
    with rdmalab.model_lab(seed=7, hosts={"a": "ib", "b": "roce"}) as lab:
        yield lab


def test_identity_and_hosts(mlab):
    assert (mlab.backend, mlab.seed) == ("model", 7)
    assert list(mlab.hosts) == ["a", "b"]
    assert mlab.host("a").caps().transport == "IB" and mlab.host("a").caps().xrc
    assert mlab.host("b").caps().transport == "RoCE" and not mlab.host("b").caps().xrc
    with pytest.raises(rdmalab.Error) as info:
        mlab.host("zz")
    assert info.value.errno == errno.ENOENT


def test_bad_lab_arguments():
    with pytest.raises(ValueError, match="unknown personality 'infiniband'; allowed: .*ib"):
        rdmalab.model_lab(hosts={"a": "infiniband"})
    with pytest.raises(TypeError, match="unknown keys"):
        rdmalab.model_lab(hosts={"a": {"personalty": "ib"}})
    with pytest.raises(TypeError, match="not a str"):
        rdmalab.model_lab(hosts="ab")


def test_run_for_advances_virtual_time_exactly(mlab):
    t0 = mlab.now_ns
    mlab.run_for(us(250))
    assert mlab.now_ns == t0 + us(250)
    mlab.sleep(us(5))
    assert mlab.now_ns == t0 + us(255)


def test_wait_until_returns_when_true(mlab):
    deadline = mlab.now_ns + us(30)
    mlab.wait_until(lambda: mlab.now_ns >= deadline, ms(1), what="30 us to pass")
    assert deadline <= mlab.now_ns < deadline + ms(1)


def test_hung_wait_dumps_what_seed_state_and_history(mlab):
    mlab.record("checkpoint", note="before the wait")
    mlab.replay = "python3 -m rdmalab run --seed 7 -k x"
    t0 = mlab.now_ns
    with pytest.raises(rdmalab.Hung) as info:
        mlab.wait_until(lambda: False, ms(2), what="a QP_FATAL that never comes")
    h = info.value
    assert isinstance(h, rdmalab.DeadlineExceeded) and h.errno == errno.ETIMEDOUT
    assert h.what == "a QP_FATAL that never comes"
    assert mlab.now_ns == t0 + ms(2)
    text = str(h)
    assert text.startswith("Hung: waited 2000000 ns for a QP_FATAL that never comes")
    assert "seed=7" in text and "replay: python3 -m rdmalab run --seed 7 -k x" in text
    assert "--- state ---" in text and "history records ---" in text
    assert '"kind": "checkpoint"' in text and "before the wait" in text


def test_history_records_and_jsonl(mlab, tmp_path):
    seq = mlab.record("note", object="scenario:x", host="a", value=3)
    recs = mlab.history()
    mine = [r for r in recs if r["seq"] == seq]
    assert mine and mine[0]["kind"] == "note" and mine[0]["data"] == {"value": 3}
    assert mine[0]["host"] == "a" and mine[0]["object"] == "scenario:x"
    path = tmp_path / "h" / "lab.jsonl"
    mlab.write_history(path)
    lines = path.read_text().splitlines()
    assert [json.loads(line)["seq"] for line in lines] == [r["seq"] for r in recs]
    assert mlab.history(since_seq=seq)[0]["seq"] == seq


def _scripted_run(seed):
    with rdmalab.model_lab(seed=seed) as lab:
        pair = rdmalab.api.resources.RCPair(lab)
        for _ in range(3):
            pair.b.post_recv(length=32)
        for _ in range(3):
            pair.a.post_send(length=32)
        assert pair.b.wait_completions(3, ms(10))
        return lab._o.history_jsonl()


def test_same_seed_same_history():
    assert _scripted_run(3) == _scripted_run(3)


def test_harness_thread_calls_back_into_the_engine(mlab):
    seen = []

    def body():
        mlab.sleep(us(10))  # an engine call from a simulated thread
        seen.append(mlab.now_ns)

    t0 = mlab.now_ns
    mlab.spawn("sleeper", body)
    mlab.run_for(us(100))
    assert seen == [t0 + us(10)]


def test_exception_in_a_harness_thread_is_recorded_and_reraised(mlab):
    def body():
        raise ValueError("boom in thread")

    mlab.spawn("bad", body)
    with pytest.raises(ValueError, match="boom in thread") as info:
        mlab.run_for(us(1))
    assert any("thread bad" in n for n in info.value.__notes__)
    errors = [r for r in mlab.history() if r["kind"] == "python_error"]
    assert errors and "boom in thread" in errors[0]["data"]["error"]
    assert errors[0]["data"]["where"] == "thread bad"
    mlab.check_errors()  # taken: nothing left


def test_raising_predicate_ends_the_wait_with_its_error(mlab):
    def pred():
        raise KeyError("pred")

    with pytest.raises(KeyError):
        mlab.wait_until(pred, ms(1))


def test_several_errors_come_back_as_a_group(mlab):
    def failing(i):
        def body():
            raise RuntimeError(f"e{i}")
        return body

    for i in range(2):
        mlab.spawn(f"bad{i}", failing(i))
    with pytest.raises(ExceptionGroup) as info:
        mlab.run_for(us(1))
    assert sorted(str(e) for e in info.value.exceptions) == ["e0", "e1"]


def test_shutdown_is_idempotent_and_objects_then_fail(mlab):
    ctx = mlab.host("a").process("p").open_device()
    mlab.shutdown()
    mlab.shutdown()
    with pytest.raises(rdmalab.Error) as info:
        ctx.alloc_pd()
    assert info.value.errno == errno.EBADF


def test_predicates_use_python_truthiness(mlab):
    with pytest.raises(rdmalab.Hung):
        mlab.wait_until(lambda: None, us(5), what="None is not true")
    with pytest.raises(rdmalab.Hung):
        mlab.wait_until(lambda: [], us(5), what="an empty list is not true")
    mlab.wait_until(lambda: [1], us(5))
