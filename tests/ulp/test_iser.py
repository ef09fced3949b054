"""iSER under faults (issue 29): LIO with ib_isert on host a, open-iscsi with ib_iser on host
b, the durability ledger writing through the session's disk (rdmalab.workloads).

The first campaign is NVMe-oF's (test_nvme_of.py) on iSER: set up, verified I/O, the target
rebooted while the answer a rebooted host gives a stale connection is dropped (IB CM: its DREP
for the initiator's DREQ; iWARP: its TCP RST), re-exported, recovery, teardown. Seed 004's
moment: its iSER initiator waited for a DISCONNECTED that never came; here it must log in again
once the target is back. The second is seed 000's on iSER: the target removed while the ledger
writes (the TPG disabled: isert closes its connections and drains their QPs, through
ib_drain_qp on iWARP); the removal finishes, and once the target is back nothing acknowledged
is lost.

Rules, each with its source:
- safety: no write the initiator was told is durable (O_DSYNC, open(2)) is lost or corrupt
  after recovery; with replacement_timeout longer than the outage no I/O error reaches the
  application (iscsid.conf(5): commands are failed only once the replacement timeout expires;
  until then the disk is blocked);
- liveness: once the target exports again, the session is LOGGED_IN within RECONNECT_S (the
  iSCSI login retries, the CM handshake and the login on a TCG guest);
- seed 004: ib_iser frees a connection only once it is DISCONNECTED (iser_verbs.c
  iser_release_work waits for it); with every DREP lost that is the DREQ's give-up, 16 sends
  6.4 s apart on 6.1 (rdmalab.api.cm_timing), counted from the session's failure (the kernel
  disconnects a failed connection at once: its DREQ went out within 0.1 s of FAILED);
- teardown: logout and the target's removal finish within TEARDOWN_S, and within RELEASE_S
  nothing of ib_iser or ib_isert (cm_ids, MRs, PD; QPs, which rdma_cm owns) is left in
  `rdma res`.
On the model (no kernel) and on namespaces of one kernel the workload refuses, which is a skip
naming why."""

from rdmalab import sec
from rdmalab.api.cm_timing import WAIT_PAST_BOUND_NS, IbCmTiming, late_bound_ns, stood_still
from rdmalab.workloads import ULP_STATE, Iser

RECONNECT_S = 60.0   # one reconnect on a TCG guest: login retries, the CM exchange, the login
TEARDOWN_S = 60.0    # logout with the target up; the target's removal with a session on it
RELEASE_S = 10.0     # a logged-out connection's DREQ answered, ib_iser's release work run
POLL_S = 1.0         # how often `rdma res` is asked (a round of five commands in a TCG guest)
REBOOT_DOWN_NS = sec(2)
# replacement_timeout well past a TCG guest's reboot (30-90 s on a loaded machine): the session
# keeps trying, I/O waits instead of failing; NOP-Outs find the dead target within 10 s.
TIMEOUTS = dict(replacement_timeout=600, noop_out_interval=5, noop_out_timeout=5)


def stale_answer_rule(lab, host: str):
    """Drops what host, once rebooted, answers for a connection it no longer has: the IB CM
    answers a DREQ for an unknown id with a DREP (cm.c cm_dreq_handler -> cm_issue_drep);
    TCP answers a segment of an unknown connection with a RST (RFC 9293 3.10.7.1). As
    test_nvme_of.py's."""
    if lab.host(host).caps().transport == "iWARP":
        return lab.faults.drop(tcp_flags="RST", src_host=host)
    return lab.faults.drop(cm="DREP", src_host=host)


def states_of(lab, unit_prefix: str) -> list[str]:
    """The initiator's ulp_state records of its session ("session") or its disk ("sd")."""
    return [r["data"]["state"] for r in lab.history() if r["kind"] == ULP_STATE
            and r["host"] == "b" and r["data"]["unit"].startswith(unit_prefix)]


def recovered(lab, iser: Iser, since: str) -> None:
    """LOGGED_IN again within the bound; the session and its disk left their working states
    meanwhile and came back to them."""
    t_export = lab.now_ns
    took = iser.wait_state("LOGGED_IN", RECONNECT_S + lab.tolerance_ns / 1e9)
    lab.record("recovered", object="iser", after_export_s=took, t_export_ns=t_export,
               since=since)
    session, disk = states_of(lab, "session"), states_of(lab, "sd")
    assert session[0] == "LOGGED_IN" and session[-1] == "LOGGED_IN" and len(session) > 2, \
        f"the session should have left LOGGED_IN while its target was down: {session}"
    assert disk[0] == "running" and "blocked" in disk, \
        f"the disk should have been blocked while its session was down: {disk}"
    iser.wait_for(lambda: iser.states()["disk"] == "running", 10.0,
                  f"{iser.disk} running again")


def stale_released(lab, iser: Iser, stale: set) -> None:
    """The connections of before the fault are gone from the initiator within the DREQ's
    give-up after the session failed (module docstring: seed 004)."""
    caps = lab.host("b").caps()
    if caps.transport == "iWARP":
        return  # no DREQ: the TCP connection's own teardown, which cm_timing does not bound
    timing = IbCmTiming.for_caps(caps)
    t_fail = lab.t0_ns + next(r["t_ns"] for r in lab.history() if r["kind"] == ULP_STATE
                              and r["host"] == "b" and r["data"]["state"] == "FAILED")
    bound = timing.dreq_give_up_ns + lab.tolerance_ns + int(POLL_S * 1e9)
    iser.wait_for(lambda: not iser.connections() & stale,
                  max(0, t_fail + bound + WAIT_PAST_BOUND_NS - lab.now_ns) / 1e9,
                  f"the connections {sorted(stale)} of before the fault released",
                  poll_s=POLL_S)
    took = lab.now_ns - t_fail
    lab.record("stale_released", object="iser", after_failure_s=took / 1e9)
    limit = late_bound_ns(lab, "b", t_fail, lab.now_ns, bound, timers=timing.attempts)
    assert took <= limit, f"the failed connection released {took / 1e9:.1f} s after the " \
        f"session failed; the DREQ gives up within {timing.dreq_give_up_ns / 1e9:.1f} s, " \
        f"{limit / 1e9:.1f} s with slack ({stood_still(lab, 'b', t_fail, lab.now_ns)})"


def released(iser: Iser, hosts=("a", "b")) -> None:
    """Nothing of the workload left in the hosts' `rdma res` within RELEASE_S."""
    iser.wait_for(lambda: not set(iser.leftovers()) & set(hosts), RELEASE_S,
                  f"nothing of ib_iser or ib_isert left in rdma res on {', '.join(hosts)}",
                  poll_s=POLL_S)


def io_survived(lab, iser: Iser) -> None:
    lab.sleep(sec(2))                              # writes after recovery, acknowledged too
    io = iser.stop_io()
    assert not io["blocked"], f"a write still blocked {io['blocked_ns'] / 1e9:.1f} s after " \
        "recovery"
    assert io["errors"] == 0, f"an I/O error reached the application with replacement_timeout " \
        f"{TIMEOUTS['replacement_timeout']} s: {io['first_error']}"
    got = iser.verify()
    assert got["acked"] > 0
    assert got["lost_count"] == 0 and got["corrupt_count"] == 0, got


def test_iser_target_reboot_with_its_stale_answers_dropped(lab):
    iser = Iser(lab, target="a", initiator="b", backing="disk", **TIMEOUTS)
    iser.setup()
    stale = iser.connections()
    iser.start_io(blocks=512)
    lab.sleep(sec(2))                              # acknowledged writes before the fault
    rule = stale_answer_rule(lab, "a")
    lab.faults.reboot("a", REBOOT_DOWN_NS)         # back when this returns, nothing exported
    iser.export()                                  # what the target's boot service does
    recovered(lab, iser, "reboot")
    stale_released(lab, iser, stale)
    rule.remove()                                  # the logout's DREQ gets its DREP
    io_survived(lab, iser)
    iser.teardown(TEARDOWN_S)
    released(iser)


def test_iser_target_removed_with_io_in_flight(lab):
    iser = Iser(lab, target="a", initiator="b", backing="disk", **TIMEOUTS)
    iser.setup()
    iser.start_io(blocks=512)
    lab.sleep(sec(2))
    took = iser.remove_target(TEARDOWN_S + 30)     # its connections closed, QPs drained
    assert took <= TEARDOWN_S, f"the target's removal took {took:.1f} s with I/O in flight"
    released(iser, hosts=("a",))                   # the drained QPs destroyed
    iser.export()
    recovered(lab, iser, "removal")
    io_survived(lab, iser)
    iser.teardown(TEARDOWN_S)
    released(iser)
