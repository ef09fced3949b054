"""NVMe over Fabrics under faults (issue 29): nvmet-rdma on host a, nvme-rdma on host b, the
durability ledger writing through the controller (rdmalab.workloads).

The campaign: set up, verified I/O, the target rebooted while the answer a rebooted host gives
a stale connection is dropped (IB CM: its DREP for the initiator's DREQ; iWARP: its TCP RST),
recovery, teardown. The seed thread 004's moment on a kernel ULP: the initiator must not wait
for ever for a DREP; it reconnects once the target is back.

Rules, each with its source:
- safety: no write the initiator was told is durable (O_DSYNC, open(2)) is lost or corrupt
  after recovery; with fast_io_fail_tmo off and ctrl_loss_tmo longer than the outage, no I/O
  error reaches the application (nvme-connect(1): I/O is failed only at those timeouts);
- liveness: once the target exports again, the controller is live within reconnect_delay plus
  one connect (RECONNECT_S: the CM handshake and the NVMe connect of every queue on a TCG
  guest);
- teardown: `nvme disconnect` and the target's removal finish within TEARDOWN_S and leave no
  cm_id, QP, CQ, MR or PD of nvme-rdma or nvmet-rdma in `rdma res`.
On the model (no kernel) and on namespaces of one kernel (nvmet-rdma makes its cm_ids in
init_net) the workload refuses, which is a skip naming why."""

from rdmalab import sec
from rdmalab.workloads import ULP_STATE, NvmeOf

RECONNECT_S = 60.0   # one reconnect on a TCG guest: the CM exchange and 1 + N queue connects
TEARDOWN_S = 60.0    # nvme disconnect with the target up
REBOOT_DOWN_NS = sec(2)
# ctrl_loss_tmo well past a TCG guest's reboot (30-90 s on a loaded machine): the controller
# keeps reconnecting, I/O waits instead of failing.
TIMEOUTS = dict(keep_alive_tmo=5, reconnect_delay=2, ctrl_loss_tmo=600, fast_io_fail_tmo=None)


def stale_answer_rule(lab, host: str):
    """Drops what host, once rebooted, answers for a connection it no longer has: the IB CM
    answers a DREQ for an unknown id with a DREP (cm.c cm_dreq_handler -> cm_issue_drep);
    TCP answers a segment of an unknown connection with a RST (RFC 9293 3.10.7.1)."""
    if lab.host(host).caps().transport == "iWARP":
        return lab.faults.drop(tcp_flags="RST", src_host=host)
    return lab.faults.drop(cm="DREP", src_host=host)


def test_nvme_target_reboot_with_its_stale_answers_dropped(lab):
    nvme = NvmeOf(lab, target="a", initiator="b", backing="disk", **TIMEOUTS)
    nvme.setup()
    nvme.start_io(blocks=512)
    lab.sleep(sec(2))                              # acknowledged writes before the fault
    stale_answer_rule(lab, "a")
    lab.faults.reboot("a", REBOOT_DOWN_NS)         # back when this returns, nothing exported
    t_export = lab.now_ns
    nvme.export()                                  # what nvmet's boot service does
    took = nvme.wait_state("live", RECONNECT_S + TIMEOUTS["reconnect_delay"]
                           + lab.tolerance_ns / 1e9)
    lab.record("recovered", object="nvme", after_export_s=took, t_export_ns=t_export)
    states = [r["data"]["state"] for r in lab.history()
              if r["kind"] == ULP_STATE and r["host"] == "b"]
    assert states[0] == "live" and states[-1] == "live" and len(states) > 2, \
        f"the controller should have left live while its target was down: {states}"
    lab.sleep(sec(2))                              # writes after recovery, acknowledged too
    io = nvme.stop_io()
    assert not io["blocked"], f"a write still blocked {io['blocked_ns'] / 1e9:.1f} s after " \
        "recovery"
    assert io["errors"] == 0, f"an I/O error reached the application with fast_io_fail off " \
        f"and ctrl_loss_tmo {TIMEOUTS['ctrl_loss_tmo']} s: {io['first_error']}"
    got = nvme.verify()
    assert got["acked"] > 0
    assert got["lost_count"] == 0 and got["corrupt_count"] == 0, got
    nvme.teardown(TEARDOWN_S)
    assert nvme.leftovers() == {}

