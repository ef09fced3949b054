"""The NFS over RDMA workload's parts that need no kernel (rdmalab.workloads.nfs, nfs_host): its
refusals, the mount options it builds, the reading of /proc/mounts and nfsd's portlist, the
calls of a setup, and the watcher that probes a mount. The workload itself runs in
tests/ulp/test_nfs.py on the VM lab."""

import threading
import time

import pytest

from rdmalab import FaultNotSupported, WorkloadError, model_lab
from rdmalab.workloads import nfs_host, records
from rdmalab.workloads.nfs import Nfs, mount_options
from workload_fakes import HostLab, UlpLab

HOST = "rdmalab.workloads.nfs_host"


def test_the_model_refuses_nfs_by_name():
    with model_lab(hosts=("a", "b")) as lab:
        with pytest.raises(FaultNotSupported) as e:
            Nfs(lab)
        assert "kernel_ulp" in str(e.value)


@pytest.mark.parametrize("kw, match", [
    (dict(vers="5"), "vers '5'"),
    (dict(timeo=0), "timeo 0"),
    (dict(timeo=1.5), "timeo 1.5"),
    (dict(retrans=True), "retrans True"),
    (dict(fsid=-1), "fsid -1"),
    (dict(grace_s=5), "grace_s 5"),
    (dict(grace_s=3601), "grace_s 3601"),
    (dict(target="a", initiator="a"), "both 'a'"),
])
def test_bad_nfs_arguments_are_named(kw, match):
    with pytest.raises(ValueError, match=match):
        Nfs(UlpLab(), **kw)


def test_an_unknown_host_is_named():
    with pytest.raises(KeyError, match="no host 'c'"):
        Nfs(UlpLab(), initiator="c")


def test_a_target_without_a_spare_disk_is_a_skip_naming_why():
    lab = UlpLab(answers={"disk_by_serial": {"device": ""}})
    with pytest.raises(FaultNotSupported) as e:
        Nfs(lab).export()
    assert "rdmalab-disk" in str(e.value)
    assert [c[2] for c in lab.calls] == ["disk_by_serial"]


# -- mount options and bounds
def test_mount_options_follow_nfs5():
    assert mount_options("4.2", 20049, True, 100, 2) == \
        "proto=rdma,port=20049,vers=4.2,hard,timeo=100,retrans=2"
    assert mount_options("3", 20049, False, None, None) == \
        "proto=rdma,port=20049,vers=3,soft,nolock"
    assert Nfs(UlpLab(), vers=4.1, timeo=None).options == \
        "proto=rdma,port=20049,vers=4.1,hard,retrans=2"


def test_the_retry_bound_is_a_cycle_of_linear_backoff():
    assert Nfs(UlpLab(), timeo=100, retrans=2).retry_bound_s() == 30.0
    assert Nfs(UlpLab(), timeo=None, retrans=None).retry_bound_s() == 180.0


# -- what the controller asks of the hosts
def test_setup_exports_then_mounts_and_waits_for_answers():
    lab = UlpLab(answers={"disk_by_serial": {"device": "/dev/vdb"}, "server_up": {},
                          "mount": {"mount_point": "/mnt/rdmalab-nfs"},
                          "state": {"state": "answering"}})
    nfs = Nfs(lab, timeo=50, retrans=3)
    nfs.wait_for = lambda pred, timeout_s, what: pred() or pytest.fail(what)
    nfs.setup()
    disk, up, mount, state = lab.calls
    assert disk == ("a", "rdmalab.workloads.host", "disk_by_serial", ("rdmalab-disk",))
    assert up == ("a", HOST, "server_up", ("rdmalab-disk", 20049, 0, None))
    assert mount[:3] == ("b", HOST, "mount")
    assert mount[3][:3] == ("10.0.0.1:/",
                            "proto=rdma,port=20049,vers=4.2,hard,timeo=50,retrans=3",
                            {"vers": "4.2", "hard": True, "timeo": 50, "retrans": 3})
    assert state == ("b", HOST, "state", ("/mnt/rdmalab-nfs",))


def test_teardown_unmounts_stops_the_server_and_lets_its_disk_go():
    """The disk is released last: another workload of the session may take it next (LIO's
    iblock opens it exclusively, EBUSY while the server's filesystem is mounted)."""
    lab = UlpLab(answers={"disk_by_serial": {"device": "/dev/vdb"}, "server_up": {},
                          "mount": {"mount_point": "/mnt/rdmalab-nfs"},
                          "state": {"state": "answering"}, "umount": {}, "server_down": {},
                          "release_disk": {}})
    nfs = Nfs(lab)
    nfs.wait_for = lambda pred, timeout_s, what: pred() or pytest.fail(what)
    nfs.setup()
    del lab.calls[:]
    nfs.teardown()
    assert [(c[0], c[2]) for c in lab.calls] == [("b", "umount"), ("a", "server_down"),
                                                 ("a", "release_disk")]


def test_nfsv4_mounts_the_pseudo_root_and_v3_the_exports_path():
    """A VM lab guest's "/" is an overlayfs, which nfsd cannot build NFSv4's pseudo-root
    from: by default v4's export is the root itself (fsid=0)."""
    assert (Nfs(UlpLab()).fsid, Nfs(UlpLab()).path) == (0, "/")
    assert (Nfs(UlpLab(), vers="3").fsid, Nfs(UlpLab(), vers="3").path) == \
        (1, "/srv/rdmalab-nfs/export")
    assert Nfs(UlpLab(), vers="4.1", fsid=7).path == "/srv/rdmalab-nfs/export"


def test_a_failed_host_step_is_a_workload_error_naming_step_and_host():
    failed = {"failed": {"step": "mount -t nfs", "errno": 0, "detail": "exited 32"}}
    nfs = Nfs(UlpLab(answers={"mount": failed}))
    with pytest.raises(WorkloadError) as e:
        nfs.connect()
    assert e.value.step == "mount -t nfs" and e.value.host == "b"


def test_leftovers_ask_each_host_for_rpcrdma():
    lab = UlpLab(answers={"kernel_owned": {"held": {}}})
    assert Nfs(lab).leftovers() == {}
    assert [(c[0], c[1], c[3]) for c in lab.calls] == [
        ("a", "rdmalab.workloads.host", (["rpcrdma", "svcrdma"],)),
        ("b", "rdmalab.workloads.host", (["rpcrdma", "svcrdma"],))]


def test_verify_before_io_is_refused():
    with pytest.raises(ValueError, match="no I/O was started"):
        Nfs(UlpLab()).verify()


# -- what the host side reads
MOUNTS = """\
/dev/vdb /srv/rdmalab-nfs ext4 rw,relatime 0 0
10.0.0.1:/srv/rdmalab-nfs/export /mnt/rdmalab-nfs nfs4 rw,vers=4.2,proto=rdma,port=20049 0 0
"""


def test_mounts_are_read_by_mount_point():
    assert nfs_host.mounted("/mnt/rdmalab-nfs", MOUNTS) == "nfs4"
    assert nfs_host.mounted("/srv/rdmalab-nfs", MOUNTS) == "ext4"
    assert nfs_host.mounted("/mnt", MOUNTS) is None


def test_the_rdma_listener_is_read_from_nfsds_portlist():
    assert nfs_host.has_listener("tcp 2049\nrdma 20049\n", 20049)
    assert not nfs_host.has_listener("tcp 2049\nudp 2049\n", 20049)
    assert not nfs_host.has_listener("rdma 20050\n", 20049)


# -- the mount's watcher
def test_the_watcher_records_a_server_that_stops_answering_and_comes_back(monkeypatch):
    monkeypatch.setattr(nfs_host, "PROBE_EVERY_S", 0.01)
    monkeypatch.setattr(nfs_host, "PROBE_LATE_S", 0.05)
    server_up, is_mounted = threading.Event(), [True]
    server_up.set()
    monkeypatch.setattr(nfs_host, "mounted", lambda p: "nfs4" if is_mounted[0] else None)
    monkeypatch.setattr(nfs_host.os, "statvfs", lambda p: server_up.wait())
    lab = HostLab()
    w = nfs_host.MountWatcher(lab, "nfs", "/mnt/x", "/mnt/x")

    def states():
        return [r["state"] for r in lab.records if r["kind"] == records.ULP_STATE]

    def wait(n):
        end = time.monotonic() + 5
        while len(states()) < n and time.monotonic() < end:
            time.sleep(0.01)

    wait(1)
    server_up.clear()
    wait(2)
    server_up.set()
    wait(3)
    is_mounted[0] = False
    wait(4)
    w.stop()
    assert states() == ["answering", "not answering", "answering", "gone"]
    assert lab.records[1]["previous"] == "answering" and lab.records[1]["unit"] == "/mnt/x"
