"""The seed moments on kernel ULPs (issue 29, item 5) beyond make test's NVMe-oF campaign
(tests/scenarios/test_nvme_of.py): run by `make test-ulp` with the fault campaigns, on vm:rxe
and vm:siw."""

import time

from rdmalab import FaultNotSupported, WorkloadError, sec
from rdmalab.workloads import NvmeOf

from test_ulp import RECONNECT_S, TEARDOWN_S, TIMEOUTS, iwarp

REJ_STALE_CONN = 10  # IBTA vol. 1 table 112 (include/rdma/ib_cm.h IB_CM_REJ_STALE_CONN)
# The target's keep-alive timer longer than the initiator's reboot (a TCG guest: 30-90 s), so
# that the target still holds the controller's connections when the initiator comes back.
KATO_PAST_REBOOT = 600


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


def cm_frames(lab, rules) -> list[dict]:
    """The CM messages the watch rules saw, in order: the frame summary with its sender."""
    by_ip = {lab.address_of(h): h for h in ("a", "b")}
    ids = {r.id for r in rules}
    return [dict(r["frame"], sender=by_ip.get(r["frame"].get("ip_src"), "?"))
            for r in lab.faults.switch_history()
            if r.get("action") == "watch" and r.get("rule") in ids]


def connect_until_live(nvme, deadline_s: float) -> list[str]:
    """nvme connect again until it succeeds (what a boot service's retries do): the errors of
    the attempts that failed; WorkloadError when none succeeded within deadline_s."""
    errors, end = [], time.monotonic() + deadline_s
    while True:
        try:
            nvme.connect(deadline_s=max(5.0, end - time.monotonic()))
            return errors
        except WorkloadError as e:
            errors.append(str(e).splitlines()[0])
            if time.monotonic() > end:
                raise WorkloadError(f"nvme connect failed {len(errors)} times in "
                                    f"{deadline_s:.0f} s: {errors}") from e
            time.sleep(1.0)


def test_nvme_initiator_rebooted_its_stale_connection_rejected_and_cleared(lab):
    """Seed 004's rule on a kernel ULP, with the roles a reboot of the initiator gives: "A local
    CM may receive a REQ/REP for a stale connection. It shall abort the connection issuing REJ
    to the REQ/REP. It shall then issue DREQ with 'DREQ:remote QPN' set to the remote QPN from
    the REQ/REP" (IBTA vol. 1 12.4.1, quoted in the seed; cm.c cm_match_req). The initiator
    reboots while the target, its keep-alive timer longer than the reboot, still holds the
    controller's connections; rxe numbers a booted device's QPs from the same start, so the
    initiator's new REQ names a QPN the target holds a connection to. The target's CM must
    reject it as stale and send the DREQ that clears the old connection (nvmet then deletes
    the old controller); a later connect succeeds, its I/O is verified, and teardown leaves
    nothing in `rdma res`. An IB CM rule: on iWARP (TCP) it is a skip saying so."""
    if iwarp(lab, "a"):
        raise FaultNotSupported("a stale connection told by QPN",
                                "an IB CM rule (IBTA 12.4.1); iWARP connects over TCP")
    lab.fresh_hosts("a", "b")
    timeouts = dict(TIMEOUTS, keep_alive_tmo=KATO_PAST_REBOOT)
    nvme = NvmeOf(lab, target="a", initiator="b", backing="disk", **timeouts)
    reqs = lab.faults.watch(cm="REQ", src_host="b")
    nvme.setup()
    old = {f["local_qpn"] for f in cm_frames(lab, [reqs])}
    assert old, "no REQ of the initiator was seen at the switch"
    nvme.start_io(blocks=256)
    lab.sleep(sec(1))
    io = nvme.stop_io()
    got = nvme.verify()
    assert io["errors"] == 0 and got["acked"] > 0 and got["lost_count"] == 0, (io, got)
    seen_before = len(cm_frames(lab, [reqs]))
    rules = [reqs, lab.faults.watch(cm="REJ", src_host="a"),
             lab.faults.watch(cm="DREQ", src_host="a")]
    lab.faults.reboot("b", sec(2))  # the target is not told: nothing is closed on b
    failed = connect_until_live(nvme, 2 * RECONNECT_S + lab.tolerance_ns / 1e9)
    after = cm_frames(lab, rules)
    new_reqs = [f for f in after if f["cm"] == "REQ"][seen_before:]
    stale = [f for f in new_reqs if f["local_qpn"] in old]
    lab.record("stale_connection", object="nvme", old_qpns=sorted(old),
               new_qpns=[f["local_qpn"] for f in new_reqs], failed_connects=failed,
               rejs=[f.get("rej_reason") for f in after if f["cm"] == "REJ"],
               dreq_qpns=[f.get("remote_qpn") for f in after if f["cm"] == "DREQ"])
    assert stale, (f"the rebooted initiator's REQs named QPNs {[f['local_qpn'] for f in new_reqs]}"
                   f", none of the old {sorted(old)}: no stale connection to show")
    for req in stale:
        rej = [f for f in after if f["cm"] == "REJ"
               and f.get("remote_comm_id") == req["local_comm_id"]]
        assert rej and rej[0].get("rej_reason") == REJ_STALE_CONN, \
            f"REQ naming the stale QPN {req['local_qpn']} answered by {rej or 'no REJ'}"
        dreq = [f for f in after if f["cm"] == "DREQ" and f.get("remote_qpn") == req["local_qpn"]]
        assert dreq, f"no DREQ of the target cleared its stale connection to QPN " \
            f"{req['local_qpn']}"
    assert failed, "a connect succeeded at once although its REQ was rejected as stale"
    nvme.start_io(blocks=256)  # the new controller works
    lab.sleep(sec(1))
    io = nvme.stop_io()
    got = nvme.verify()
    assert io["errors"] == 0 and got["acked"] > 0 and got["lost_count"] == 0, (io, got)
    nvme.teardown(TEARDOWN_S)
    assert nvme.leftovers() == {}  # the old controller's QPs on the target went too
