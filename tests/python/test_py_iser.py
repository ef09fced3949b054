"""The iSER workload's parts that need no kernel (rdmalab.workloads.iser, iser_host): its
refusals, the configfs layout LIO gets and the order it is written in, the identifiers that
outlive a target's reboot, and the reading of iscsiadm's answers. The workload itself runs in
tests/scenarios/test_iser.py on the VM lab."""

import os
import stat

import pytest

from rdmalab import FaultNotSupported, WorkloadError, model_lab
from rdmalab.workloads import Iser, host, iser_host, records
from rdmalab.workloads.host import StepFailed
from workload_fakes import HostLab, UlpLab

ROOT = "/sys/kernel/config/target"
IQN = "iqn.2026-11.io.rdmalab:iser"


def test_the_model_refuses_iser_by_name():
    with model_lab(hosts=("a", "b")) as lab:
        with pytest.raises(FaultNotSupported) as e:
            Iser(lab)
        assert "kernel_ulp" in str(e.value)


def test_iser_on_namespaces_of_one_kernel_is_refused_with_the_reason():
    with pytest.raises(FaultNotSupported) as e:
        Iser(UlpLab(one_kernel=True))
    assert "init_net" in str(e.value) and "ib_isert" in str(e.value)
    assert Iser(UlpLab()).initiator == "b"


@pytest.mark.parametrize("kw, match", [
    (dict(backing="tape"), "backing 'tape'"),
    (dict(iqn="target1"), "iqn 'target1'"),
    (dict(iqn="iqn.2026-11.io.rdmalab:a b"), "no spaces"),
    (dict(iqn="iqn." + "x" * 220), "223 bytes"),
    (dict(replacement_timeout=-1), "replacement_timeout=-1"),
    (dict(noop_out_interval="5"), "noop_out_interval='5'"),
    (dict(noop_out_timeout=True), "noop_out_timeout=True"),
    (dict(target="a", initiator="a"), "both 'a'"),
])
def test_bad_iser_arguments_are_named(kw, match):
    with pytest.raises(ValueError, match=match):
        Iser(UlpLab(), **kw)


def test_an_unknown_host_is_named():
    with pytest.raises(KeyError, match="no host 'c'"):
        Iser(UlpLab(), initiator="c")


def test_a_failed_host_step_is_a_workload_error_naming_step_and_host():
    failed = {"failed": {"step": "write /sys/kernel/config/target/x/iser", "errno": 98,
                         "detail": "'1': Address already in use"}}
    iser = Iser(UlpLab(answers={"null_blk": {"device": "/dev/nullb0"}, "target_up": failed}))
    with pytest.raises(WorkloadError) as e:
        iser.export()
    assert e.value.step == failed["failed"]["step"] and e.value.host == "a"
    assert e.value.errno == 98 and "Address already in use" in str(e.value)


def test_isert_refused_its_port_on_a_software_iwarp_device_is_a_skip_naming_why():
    """siw's listener is a kernel TCP socket on the portal's address and port, which LIO's own
    TCP listener holds: the iser write fails with EADDRINUSE; the half-built target goes."""
    where = f"write {ROOT}/iscsi/{IQN}/tpgt_1/np/10.0.0.1:3260/iser"
    failed = {"failed": {"step": where, "errno": 98, "detail": "'1': Address in use"}}
    answers = {"null_blk": {"device": "/dev/nullb0"}, "target_up": failed,
               "target_down": {"took_s": 0.1}}
    lab = UlpLab(answers=answers, device=("siw0", "iWARP"))
    with pytest.raises(FaultNotSupported) as e:
        Iser(lab).export()
    assert e.value.fault == "iser on siw0"
    assert "siw_create_listen" in str(e.value) and "portal 10.0.0.1:3260" in str(e.value)
    assert [c[2] for c in lab.calls] == ["null_blk", "target_up", "target_down"]
    with pytest.raises(WorkloadError):  # the same answer from a RoCE device is a failure
        Iser(UlpLab(answers=answers)).export()


def test_export_and_login_go_to_their_hosts_with_the_scenario_timeouts():
    lab = UlpLab(answers={"disk_by_serial": {"device": "/dev/vda"}, "target_up": {},
                          "login": {"session": "session1", "disk": "sda",
                                    "device": "/dev/sda"},
                          "state": {"session": "LOGGED_IN", "disk": "running"}})
    iser = Iser(lab, backing="disk", replacement_timeout=600, noop_out_interval=2)
    iser.wait_for = lambda pred, timeout_s, what: pred() or pytest.fail(what)
    iser.setup()
    (_, nvme, _, serial), up, login = lab.calls[:3]
    assert nvme == "rdmalab.workloads.host" and serial == ("rdmalab-disk",)
    assert up == ("a", "rdmalab.workloads.iser_host", "target_up",
                  (IQN, "/dev/vda", "10.0.0.1", 3260))
    assert login[:3] == ("b", "rdmalab.workloads.iser_host", "login")
    assert login[3][:4] == (IQN, "10.0.0.1", 3260, {
        "replacement_timeout": 600, "noop_out_interval": 2, "noop_out_timeout": 5,
        "login_timeout": None})
    assert (iser.session, iser.device) == ("session1", "/dev/sda")


# -- what the target's configfs gets
def test_the_target_paths_follow_lios_configfs_layout():
    p = iser_host.target_paths(ROOT, IQN, "10.0.0.1", 3260)
    tpg = f"{ROOT}/iscsi/{IQN}/tpgt_1"
    assert p == {"hba": f"{ROOT}/core/iblock_0", "object": f"{ROOT}/core/iblock_0/rdmalab",
                 "serial": f"{ROOT}/core/iblock_0/rdmalab/wwn/vpd_unit_serial",
                 "fabric": f"{ROOT}/iscsi", "wwn": f"{ROOT}/iscsi/{IQN}", "tpg": tpg,
                 "lun": f"{tpg}/lun/lun_0", "lun_link": f"{tpg}/lun/lun_0/rdmalab",
                 "np": f"{tpg}/np/10.0.0.1:3260", "attrib": f"{tpg}/attrib"}
    assert iser_host.target_paths(ROOT, IQN, "fd00::1", 3261)["np"] == \
        f"{tpg}/np/[fd00::1]:3261"


def test_the_unit_serial_is_the_same_at_every_export_and_fits_vpd_0x80():
    s = iser_host.unit_serial(IQN)
    assert s == iser_host.unit_serial(IQN) != iser_host.unit_serial(IQN + "2")
    assert len(s) == 32 and int(s, 16) >= 0  # INQUIRY_VPD_SERIAL_LEN is 254
    assert iser_host.shown_serial(f"T10 VPD Unit Serial Number: {s}\n") == s
    assert iser_host.shown_serial("T10 VPD Unit Serial Number: \n") == ""
    assert iser_host.shown_serial(None) == ""


class Configfs:
    """configfs as the target's host side sees it: attributes by path (a serial shown as LIO
    shows it), directories, links; every change in order."""

    def __init__(self, monkeypatch):
        self.attrs, self.dirs, self.changes = {}, set(), []
        for name, fn in (("write_attr", self.write), ("read_attr", self.read),
                         ("ensure_dir", self.mkdir), ("modprobe", lambda *m: None),
                         ("configfs", lambda: "/sys/kernel/config")):
            monkeypatch.setattr(iser_host, name, fn)
        for name, fn in (("write_attr", self.write), ("read_attr", self.read)):
            monkeypatch.setattr(host, name, fn)  # what host.set_attr reads and writes
        monkeypatch.setattr(iser_host.os, "symlink", self.symlink)
        monkeypatch.setattr(iser_host.os.path, "islink", lambda p: p in self.dirs)

    def write(self, path, value):
        self.attrs[path] = value
        self.changes.append(("write", path.removeprefix(ROOT + "/"), value))

    def read(self, path):
        v = self.attrs.get(path)
        return f"T10 VPD Unit Serial Number: {v}" if v and path.endswith("serial") else v

    def mkdir(self, path):
        if path not in self.dirs:
            self.dirs.add(path)
            self.changes.append(("mkdir", path.removeprefix(ROOT + "/")))

    def symlink(self, src, dst):
        self.dirs.add(dst)
        self.changes.append(("link", dst.removeprefix(ROOT + "/"), src.removeprefix(ROOT + "/")))


def test_target_up_writes_in_rtslibs_order_and_a_second_export_changes_nothing(monkeypatch):
    fs, lab = Configfs(monkeypatch), HostLab("a")
    got = iser_host.target_up(lab, IQN, "/dev/vda", "10.0.0.1", 3260)
    assert got == {"serial": iser_host.unit_serial(IQN), "portal": "10.0.0.1:3260"}
    tpg, obj = f"iscsi/{IQN}/tpgt_1", "core/iblock_0/rdmalab"
    assert fs.changes == [
        ("mkdir", "core/iblock_0"), ("mkdir", obj),
        ("write", f"{obj}/udev_path", "/dev/vda"),
        ("write", f"{obj}/control", "udev_path=/dev/vda"),
        ("write", f"{obj}/control", "readonly=0"), ("write", f"{obj}/enable", "1"),
        ("write", f"{obj}/wwn/vpd_unit_serial", iser_host.unit_serial(IQN)),
        ("mkdir", "iscsi"), ("mkdir", f"iscsi/{IQN}"), ("mkdir", tpg),
        ("mkdir", f"{tpg}/lun/lun_0"), ("link", f"{tpg}/lun/lun_0/rdmalab", obj),
        ("mkdir", f"{tpg}/np/10.0.0.1:3260"), ("write", f"{tpg}/np/10.0.0.1:3260/iser", "1"),
        ("write", f"{tpg}/attrib/authentication", "0"),
        ("write", f"{tpg}/attrib/generate_node_acls", "1"),
        ("write", f"{tpg}/attrib/demo_mode_write_protect", "0"),
        ("write", f"{tpg}/attrib/cache_dynamic_acls", "1"),
        ("write", f"{tpg}/enable", "1")]
    fs.changes.clear()
    iser_host.target_up(lab, IQN, "/dev/vda", "10.0.0.1", 3260)
    assert fs.changes == []
    assert [(r["object"], r["step"], r["ok"]) for r in lab.records] == \
        [("iser", "target_up", True)] * 2
    other = iser_host.target_up(lab, IQN, "/dev/nullb0", "10.0.0.1", 3260)["failed"]
    assert other["errno"] == 16 and "already exports /dev/vda" in other["detail"]  # EBUSY


def test_target_down_undoes_innermost_first_and_skips_what_is_gone(monkeypatch, tmp_path):
    p = iser_host.target_paths(str(tmp_path / "target"), IQN, "10.0.0.1", 3260)
    for d in ("object", "np", "lun"):
        os.makedirs(p[d])
    with open(os.path.join(p["tpg"], "enable"), "w") as out:  # the portal's iser: gone
        out.write("1")
    os.symlink(p["object"], p["lun_link"])
    done = []
    monkeypatch.setattr(iser_host, "configfs", lambda: str(tmp_path))
    monkeypatch.setattr(iser_host, "write_attr", lambda f, v: done.append(("write", f, v)))
    monkeypatch.setattr(iser_host.os, "rmdir", lambda d: done.append(("rmdir", d)))
    monkeypatch.setattr(iser_host.os, "unlink", lambda d: done.append(("unlink", d)))
    assert iser_host.target_down(HostLab("a"), IQN, "10.0.0.1", 3260)["took_s"] >= 0
    assert done == [("write", os.path.join(p["tpg"], "enable"), "0"), ("rmdir", p["np"]),
                    ("unlink", p["lun_link"]), ("rmdir", p["lun"]), ("rmdir", p["tpg"]),
                    ("rmdir", p["wwn"]), ("rmdir", p["object"]), ("rmdir", p["hba"])]


def test_a_failed_configfs_write_is_a_failed_answer_recorded_as_iser(monkeypatch):
    def refuse(*modules):
        raise StepFailed("modprobe ib_isert", 0, "modprobe ib_isert exited 1: not found")

    monkeypatch.setattr(iser_host, "modprobe", refuse)
    lab = HostLab("a")
    got = iser_host.target_up(lab, IQN, "/dev/vda", "10.0.0.1", 3260)
    assert got == {"failed": {"step": "modprobe ib_isert", "errno": 0,
                              "detail": "modprobe ib_isert exited 1: not found"}}
    (r,) = [r for r in lab.records if r["kind"] == records.WORKLOAD]
    assert (r["object"], r["step"], r["ok"], r["portal"]) == \
        ("iser", "target_up", False, "10.0.0.1:3260")


# -- what iscsiadm says
def test_discovery_lines_are_read_for_ipv4_and_ipv6_portals():
    out = ("10.0.0.1:3260,1 iqn.2026-11.io.rdmalab:iser\n"
           "[fd00::1]:3260,2 iqn.2026-11.io.rdmalab:other\n"
           "iscsiadm: some warning\n")
    assert iser_host.parse_discovery(out) == [
        {"portal": "10.0.0.1:3260", "tpgt": "1", "target": IQN},
        {"portal": "[fd00::1]:3260", "tpgt": "2", "target": "iqn.2026-11.io.rdmalab:other"}]


def test_session_lines_are_read_with_their_transport_and_sid():
    out = ("tcp: [3] 192.168.1.5:3260,1 iqn.2003-01.org.linux-iscsi.x:sn.1 (non-flash)\n"
           "iser: [12] 10.0.0.1:3260,1 iqn.2026-11.io.rdmalab:iser (non-flash)\n")
    got = iser_host.parse_sessions(out)
    assert got[1] == {"transport": "iser", "sid": "12", "portal": "10.0.0.1:3260",
                      "tpgt": "1", "target": IQN}
    assert got[0]["transport"] == "tcp" and got[0]["sid"] == "3"
    assert iser_host.parse_sessions("iscsiadm: No active sessions.\n") == []


def test_iface_lines_are_read_as_name_and_transport():
    out = ("default tcp,<empty>,<empty>,<empty>,<empty>\n"
           "iser iser,<empty>,<empty>,<empty>,<empty>\n"
           "rdmalab-iser iser,<empty>,<empty>,<empty>,<empty>\n")
    assert iser_host.parse_ifaces(out) == {"default": "tcp", "iser": "iser",
                                           "rdmalab-iser": "iser"}


def test_node_settings_name_only_the_timeouts_chosen():
    assert iser_host.node_settings({"replacement_timeout": 600, "noop_out_interval": 5,
                                    "noop_out_timeout": None, "login_timeout": 0}) == [
        ("node.session.timeo.replacement_timeout", "600"),
        ("node.conn[0].timeo.noop_out_interval", "5"),
        ("node.conn[0].timeo.login_timeout", "0")]


def test_the_initiator_name_is_an_iqn_of_this_boot():
    assert iser_host.initiator_name("VM_2", "0c1d2e3f-aaaa-bbbb") == \
        "iqn.2026-11.io.rdmalab:vm-2.0c1d2e3f"


def fake_iscsiadm(tmp_path, monkeypatch, code: int, said: str):
    exe = tmp_path / "iscsiadm"
    exe.write_text(f"#!/bin/sh\necho '{said}' >&2\nexit {code}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")


def test_iscsiadm_codes_a_step_allows_are_answers_others_failures(tmp_path, monkeypatch):
    fake_iscsiadm(tmp_path, monkeypatch, 21, "iscsiadm: No active sessions.")
    assert iser_host.iscsiadm(["-m", "session"], 10.0, allow=(21,)) == (21, "")
    with pytest.raises(StepFailed) as e:
        iser_host.iscsiadm(["-m", "session"], 10.0)
    assert e.value.step == "iscsiadm -m session"
    assert "exited 21: iscsiadm: No active sessions." in e.value.detail
