"""NFS over RDMA under a server reboot (issue 29): the kernel's nfsd exporting host a's spare
disk over RDMA, host b's hard mount, the durability ledger writing a file on it
(rdmalab.workloads.Nfs).

The campaign: set up, verified I/O, the server rebooted and started again (what its boot
service does), recovery, teardown. Rules, each with its source:
- safety: no write the client was told is durable (O_DIRECT | O_DSYNC: a stable WRITE or one
  COMMITted, RFC 1813 3.3.7 / RFC 7530 16.36) is lost or corrupt after recovery; the export's
  fsid is fixed, so its file handles outlive the reboot; with a hard mount no I/O error reaches
  the application (nfs(5): "the NFS client retries the request indefinitely");
- liveness: once the server exports again, the mount answers within one retry cycle of the
  mount (Nfs.retry_bound_s: timeo growing by timeo for retrans retransmissions, then again)
  plus the longest wait of the transport between two connects (RPCRDMA_MAX_REEST_TO, 30 s,
  net/sunrpc/xprtrdma/xprt_rdma.h), a reconnect, and with NFSv4 the server's grace period:
  on 6.1 (rxe and siw) the transport was back seconds after the export ("nfs: server ... OK")
  but the client's I/O resumed only when the grace ended (105 s after the export with the
  default 90 s, 17 s with GRACE_S). During the grace nfsd answers NFS4ERR_GRACE to an OPEN
  that reclaims nothing (nfsd4_open, fs/nfsd/nfs4proc.c) and to I/O under a special stateid
  (check_special_stateids, fs/nfsd/nfs4state.c); which of them held this client is not known
  yet (the server logs "Failed to remove expired client state directory" after the grace);
- teardown: umount and the server's stop finish within TEARDOWN_S and leave no cm_id, QP, CQ,
  MR or PD of rpcrdma (client or server) in `rdma res`.
On the model (no kernel) the workload refuses, which is a skip naming why."""

import pytest

from rdmalab import sec
from rdmalab.workloads import ULP_STATE
from rdmalab.workloads.nfs import Nfs

REESTABLISH_MAX_S = 30.0  # RPCRDMA_MAX_REEST_TO: the longest backoff between two connects
RECONNECT_S = 60.0        # a connect (and NFSv4's new session and reclaims) on a TCG guest
TEARDOWN_S = 60.0
REBOOT_DOWN_NS = sec(2)
MOUNT = dict(hard=True, timeo=100, retrans=2)
GRACE_S = 15  # the server's NFSv4 grace (the kernel's 90 s lease time by default)


@pytest.mark.parametrize("vers", ["3", "4.2"])
def test_nfs_server_reboot_hard_mount(lab, vers):
    grace_s = GRACE_S if vers.startswith("4") else None
    nfs = Nfs(lab, target="a", initiator="b", vers=vers, grace_s=grace_s, **MOUNT)
    nfs.setup()
    nfs.start_io(blocks=256)
    lab.sleep(sec(2))                              # acknowledged writes before the fault
    lab.faults.reboot("a", REBOOT_DOWN_NS)         # back when this returns, nfsd not running
    t_export = lab.now_ns
    nfs.export()                                   # what nfs-kernel-server's boot does
    bound = nfs.retry_bound_s() + REESTABLISH_MAX_S + RECONNECT_S + (grace_s or 0) + \
        lab.tolerance_ns / 1e9
    took = nfs.wait_state("answering", bound)
    lab.record("recovered", object="nfs", after_export_s=took, t_export_ns=t_export)
    states = [r["data"]["state"] for r in lab.history()
              if r["kind"] == ULP_STATE and r["host"] == "b"]
    assert states[0] == "answering" and "not answering" in states, \
        f"the mount should have stopped answering while its server was down: {states}"
    lab.sleep(sec(3))                              # writes after recovery, acknowledged too
    io = nfs.stop_io(deadline_s=bound)
    assert not io["blocked"], f"a write still blocked {io['blocked_ns'] / 1e9:.1f} s after " \
        "recovery"
    assert io["errors"] == 0, f"an I/O error reached the application through a hard mount: " \
        f"{io['first_error']}"
    got = nfs.verify()
    assert got["acked"] > 0
    assert got["lost_count"] == 0 and got["corrupt_count"] == 0, got
    nfs.teardown(TEARDOWN_S)
    assert nfs.leftovers() == {}
