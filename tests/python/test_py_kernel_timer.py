"""The kernel timer wheel as cm_timing predicts it (rdmalab/kernel_timer.h, bound in _core),
and the host's HZ probe (rdmalab.kernel)."""

import gzip

import pytest

from rdmalab import kernel
from rdmalab import model_lab, ms, sec
from rdmalab.api.cm_timing import IbCmTiming, kernel_timer_range_ns, late_bound_ns


def test_dreq_give_up_at_250_hz_is_102_144_to_102_4_s():
    t = IbCmTiming(kernel_hz=250)
    assert t.active_timeout_ms == 6144
    assert t.retry_period_range_ns == (ms(6400), ms(6400))
    lo, hi = t.dreq_give_up_range_ns
    assert (lo, hi) == (ms(102144) + 1, ms(102400))
    assert t.dreq_give_up_ns == hi
    assert t.timewait_ms == 2048 and t.timewait_range_ns == (ms(2048) + 1, ms(2304))


def test_unknown_hz_spans_every_choice():
    lo, hi = kernel_timer_range_ns(6144, 0)
    for hz in kernel.HZ_CHOICES:
        a, b = kernel_timer_range_ns(6144, hz)
        assert lo <= a and b <= hi
    assert hi > kernel_timer_range_ns(6144, 250)[1]  # HZ=1000: level 3, 512 ms buckets


def test_model_personalities_run_a_250_hz_kernel():
    lab = model_lab(hosts=("a",), personality="roce")
    try:
        assert lab.host("a").caps().kernel_hz == 250
    finally:
        lab.shutdown()


def test_hz_from_config(tmp_path):
    assert kernel.hz_from_config(b"CONFIG_HZ_250=y\nCONFIG_HZ=250\n") == 250
    assert kernel.hz_from_config(b"# CONFIG_HZ is not set\n") is None
    p = tmp_path / "config.gz"
    p.write_bytes(gzip.compress(b"CONFIG_HZ=1000\n"))
    assert kernel.hz_from_config(kernel._read(str(p))) == 1000


def test_hz_from_timer_list_snaps_to_a_kconfig_choice():
    first = b"Timer List Version: v0.9\nnow at 1000000000 nsecs\n\njiffies: 4295000000\n"
    second = b"now at 1200000000 nsecs\njiffies: 4295000051\n"  # 51 jiffies in 200 ms
    assert kernel.hz_from_timer_list(first, second) == 250
    assert kernel.hz_from_timer_list(first, first) is None
    assert kernel.hz_from_timer_list(b"garbage", second) is None


def test_the_wheel_is_the_models_clock():
    """The model's TIMEWAIT (2048 ms) ends where cm_timing's range says, not at 2048 ms."""
    lab = model_lab(hosts=("a", "b"), personality="roce")
    try:
        from rdmalab.api.resources import CmPair
        pair = CmPair(lab)
        t = IbCmTiming.for_caps(lab.host("a").caps())
        pair.client.conn.disconnect()
        pair.server.conn.wait("DISCONNECTED", ms(10))
        pair.server.conn.disconnect()
        dis = pair.client.conn.wait("DISCONNECTED", ms(10))
        ex = pair.client.conn.wait("TIMEWAIT_EXIT", sec(3))
        lo, hi = t.timewait_range_ns
        assert lo <= ex.t_ns - dis.t_ns <= hi
        assert ex.t_ns - dis.t_ns > ms(2048)  # the wheel's rounding, not the formula
    finally:
        lab.shutdown()


def test_syn_give_up_runs_on_the_wheel():
    """7 RTOs of 1..64 s at HZ=250: 127 s plus each one's bucket (8, 8, 64, 64, 64, 512, 512
    jiffies), so the call returns 127-131.928 s after it was made (siw measured 129.95 s)."""
    from rdmalab.api.cm_timing import tcp_syn_give_up_range_ns
    lo, hi = tcp_syn_give_up_range_ns(6, 250)
    assert lo == sec(127) + 7
    assert hi == sec(127) + ms(4928)


def test_roce_packet_life_time_follows_the_kernel_release():
    """cma.c's CMA_IBOE_PACKET_LIFETIME went from 18 to 16 in 6.2: TIMEWAIT on RoCE is 2048 ms
    on bookworm's 6.1 and 512 ms on trixie's 6.12 and sid's 7.2 (measured on rxe: 543 ms)."""
    from rdmalab.api.cm_timing import IbCmTiming, iboe_packet_life_time

    assert iboe_packet_life_time("6.1.0-56-amd64") == 18
    assert iboe_packet_life_time("6.12.117+deb13-amd64") == 16
    assert iboe_packet_life_time("7.2.13+deb14-amd64") == 16
    assert iboe_packet_life_time("") == 18

    class Caps:
        local_ca_ack_delay, kernel_hz = 15, 250

    for release, timewait, req in (("6.1.0-56-amd64", 2048, 6144), ("7.2.13+deb14-amd64", 512, 4608)):
        Caps.kernel_release = release
        t = IbCmTiming.for_caps(Caps())
        assert (t.timewait_ms, t.active_timeout_ms) == (timewait, req)


def test_the_model_never_stands_still():
    """late_bound_ns on the model is the bound itself: no slack, no stall."""
    lab = model_lab(1, ("a", "b"))
    assert lab.stalled_ns("a", 0, sec(100)) == 0
    assert late_bound_ns(lab, "a", 0, sec(100), ms(2304), timers=3) == ms(2304)
    with pytest.raises(Exception, match="no host 'c'"):
        lab.stalled_ns("c", 0, 1)
