"""The seed moments on kernel ULPs (issue 29, item 5) beyond make test's NVMe-oF campaign
(tests/scenarios/test_nvme_of.py): run by `make test-ulp` with the fault campaigns, on vm:rxe
and vm:siw."""

from rdmalab import sec
from rdmalab.workloads import NvmeOf

from test_ulp import RECONNECT_S, TEARDOWN_S, TIMEOUTS


def test_nvme_target_torn_down_with_io_in_flight(lab):
    """Seed 000 on a kernel ULP: the target removes its port, namespace and subsystem while
    the initiator writes (nvmet-rdma deletes the port's controllers and drains their QPs
    through ib_drain_qp: on iWARP the drain that once hung). The removal finishes within
    TEARDOWN_S; exported again, the initiator reconnects and nothing it was told is durable is
    lost."""
    lab.fresh_hosts("a", "b")  # devices as booted (test_ulp.py)
    nvme = NvmeOf(lab, target="a", initiator="b", backing="disk", **TIMEOUTS)
    nvme.setup()
    nvme.start_io(blocks=512)
    lab.sleep(sec(2))
    took = nvme.remove_target()
    assert took <= TEARDOWN_S, f"the target's removal took {took:.1f} s with I/O in flight"
    nvme.export()
    nvme.wait_state("live", RECONNECT_S + TIMEOUTS["reconnect_delay"] + lab.tolerance_ns / 1e9)
    lab.sleep(sec(1))
    io = nvme.stop_io()
    assert not io["blocked"] and io["errors"] == 0, io
    got = nvme.verify()
    assert got["acked"] > 0 and got["lost_count"] == 0 and got["corrupt_count"] == 0, got
    nvme.teardown(TEARDOWN_S)
    assert nvme.leftovers() == {}
