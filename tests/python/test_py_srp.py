"""The SRP workload's parts that need no kernel (rdmalab.workloads.srp, srp_host): its
refusals, the timeouts srp_tmo_valid takes, the names ib_srpt gives ports and initiators, the
login string ib_srp parses, and the configfs layout of the target. The workload itself runs
in tests/ulp/test_srp.py on the VM lab."""


import pytest

from rdmalab import FaultNotSupported, WorkloadError, model_lab
from rdmalab.workloads import srp_host
from rdmalab.workloads.srp import Srp, check_timeouts
from workload_fakes import UlpLab

GID_A = "fe80:0000:0000:0000:5054:00ff:fe12:3456"   # rxe: link-local, from the MAC
GID_B = "5254:00ab:cdef:0000:0000:0000:0000:0000"   # siw: the MAC, zero padded
GUID = "0x505400fffe123456"


def answers(**more):
    got = {"disk_by_serial": {"device": "/dev/vdb"},
           "port_of": lambda host: {"device": "rxe0", "port": 1,
                                    "gid": GID_A if host == "a" else GID_B,
                                    "link_local": f"fe80::{host}", "ifindex": 3},
           "target_up": {"guid": GUID, "tport": "0x" + GID_A.replace(":", "")},
           "login": {"host": 3, "rport": "port-3:1", "disk": "sda", "device": "/dev/sda",
                     "applied": {}},
           "state": {"rport": "running", "disk": "running"}}
    got.update(more)
    return got


# -- refusals
def test_the_model_refuses_srp_by_name():
    with model_lab(hosts=("a", "b")) as lab:
        with pytest.raises(FaultNotSupported) as e:
            Srp(lab)
        assert "kernel_ulp" in str(e.value)


def test_srp_on_namespaces_of_one_kernel_is_refused_with_the_reason():
    with pytest.raises(FaultNotSupported) as e:
        Srp(UlpLab(one_kernel=True))
    assert "init_net" in str(e.value) and "srpt_create_rdma_id" in str(e.value)
    assert Srp(UlpLab()).initiator == "b"


@pytest.mark.parametrize("kw, match", [
    (dict(backing="null_blk"), "backing 'null_blk'"),
    (dict(port=0), "port 0"),
    (dict(port=True), "port True"),
    (dict(reconnect_delay=0), "reconnect_delay=0"),
    (dict(dev_loss_tmo="600"), "dev_loss_tmo='600'"),
    (dict(fast_io_fail_tmo=2.5), "fast_io_fail_tmo=2.5"),
    (dict(fast_io_fail_tmo=600, dev_loss_tmo=600), "below dev_loss_tmo"),
    (dict(fast_io_fail_tmo=30, dev_loss_tmo=None), None),
    (dict(fast_io_fail_tmo="off", dev_loss_tmo=601), "at most 600 s"),
    (dict(fast_io_fail_tmo=601, dev_loss_tmo="off"), "at most 600 s"),
    (dict(reconnect_delay="off", fast_io_fail_tmo="off", dev_loss_tmo="off"), "all off"),
    (dict(scsi_timeout=0), "scsi_timeout=0"),
    (dict(tl_retry_count=1), "tl_retry_count=1"),
    (dict(tl_retry_count=8), "tl_retry_count=8"),
    (dict(target="a", initiator="a"), "both 'a'"),
])
def test_bad_srp_arguments_are_named(kw, match):
    if match is None:  # a valid combination: nothing raised
        Srp(UlpLab(), **kw)
        return
    with pytest.raises(ValueError, match=match):
        Srp(UlpLab(), **kw)


def test_timeouts_left_to_the_kernel_are_checked_with_its_defaults():
    check_timeouts({"reconnect_delay": None, "fast_io_fail_tmo": None, "dev_loss_tmo": None})
    with pytest.raises(ValueError, match="fast_io_fail_tmo 15 must be below dev_loss_tmo 10"):
        check_timeouts({"reconnect_delay": None, "fast_io_fail_tmo": None, "dev_loss_tmo": 10})
    check_timeouts({"reconnect_delay": 1, "fast_io_fail_tmo": "off", "dev_loss_tmo": 600})


def test_an_unknown_host_is_named():
    with pytest.raises(KeyError, match="no host 'c'"):
        Srp(UlpLab(), initiator="c")


# -- names and the login string
def test_ports_and_initiators_are_named_as_ib_srpt_names_them():
    assert srp_host.tport_name(GID_A) == "0xfe80000000000000505400fffe123456"
    ext, port_id = srp_host.initiator_port_id(GID_B)
    assert ext == "525400abcdef0000"
    assert port_id == "0x525400abcdef00000000000000000000"
    with pytest.raises(ValueError, match="not a GID"):
        srp_host.tport_name("fe80::1")


def test_the_login_string_holds_what_ib_srp_needs_over_rdma_cm():
    s = srp_host.login_string(GUID, "10.0.0.1", 5555, "525400abcdef0000", "10.0.0.2")
    assert s == ("id_ext=505400fffe123456,ioc_guid=505400fffe123456,"
                 "initiator_ext=525400abcdef0000,dest=10.0.0.1:5555,src=10.0.0.2")
    assert "dest=[fd00::1]:5555" in srp_host.login_string(GUID, "fd00::1", 5555, "0")
    assert "src=" not in srp_host.login_string(GUID, "10.0.0.1", 5555, "0")
    assert srp_host.login_string(GUID, "10.0.0.1", 5555, "0", tl_retry_count=6).endswith(
        ",tl_retry_count=6")
    with pytest.raises(ValueError, match="64-bit GUID"):
        srp_host.login_string("0x" + "f" * 17, "10.0.0.1", 5555, "0")


def test_timeouts_as_sysfs_takes_them():
    assert srp_host.tmo_text("off") == "off" and srp_host.tmo_text(600) == "600"


def test_rdma_links_are_read_with_their_netdev():
    text = ('[{"ifindex":1,"ifname":"rxe0","port":1,"state":"ACTIVE",'
            '"physical_state":"LINK_UP","netdev":"eth1","netdev_index":3},'
            '{"ifindex":2,"ifname":"siw0","port":1,"state":"DOWN"}]')
    assert srp_host.parse_links(text) == [
        {"device": "rxe0", "port": 1, "netdev": "eth1"},
        {"device": "siw0", "port": 1, "netdev": ""}]


def test_the_unit_serial_outlives_a_reboot_and_differs_from_iser():
    assert srp_host.unit_serial("x") == srp_host.unit_serial("x")
    assert srp_host.unit_serial("x") != srp_host.unit_serial("y")
    assert len(srp_host.unit_serial("x")) == 32


def test_the_target_layout_is_the_port_its_tpg_lun_and_the_initiator_acl():
    p = srp_host.target_paths("/t", GID_A, "0xabc")
    tpg = "/t/srpt/0xfe80000000000000505400fffe123456/tpgt_1"
    assert p["object"] == "/t/core/iblock_1/rdmalab-srp"
    assert p["cm_port"] == "/t/srpt/discovery_auth/rdma_cm_port"
    assert p["tpg"] == tpg and p["lun_link"] == tpg + "/lun/lun_0/rdmalab-srp"
    assert p["mapped_link"] == tpg + "/acls/0xabc/lun_0/lun_0"


# -- the controller's calls
def test_export_and_login_go_to_their_hosts_with_the_scenario_timeouts():
    lab = UlpLab(answers=answers())
    srp = Srp(lab, reconnect_delay=3, fast_io_fail_tmo="off", dev_loss_tmo=120)
    srp.wait_for = lambda pred, timeout_s, what: pred() or pytest.fail(what)
    srp.setup()
    fns = [(c[0], c[2]) for c in lab.calls]
    assert fns == [("a", "disk_by_serial"), ("a", "port_of"), ("b", "port_of"),
                   ("a", "target_up"), ("b", "port_of"), ("b", "login"), ("b", "state")]
    up = lab.calls[3][3]
    assert up == ("rdmalab-srp", "/dev/vdb", GID_A, 5555, GID_B)
    options, device, port, guid, timeouts, _ = lab.calls[5][3]
    assert options == ("id_ext=505400fffe123456,ioc_guid=505400fffe123456,"
                       "initiator_ext=525400abcdef0000,dest=10.0.0.1:5555,src=10.0.0.2")
    assert (device, port, guid) == ("rxe0", 1, GUID)
    assert timeouts == {"reconnect_delay": 3, "fast_io_fail_tmo": "off", "dev_loss_tmo": 120,
                        "scsi_timeout": None}
    assert (srp.rport, srp.device) == ("port-3:1", "/dev/sda")


def test_connect_before_export_is_refused():
    with pytest.raises(ValueError, match="not exported"):
        Srp(UlpLab(answers=answers())).connect()


def test_no_spare_disk_is_a_skip_naming_it():
    with pytest.raises(FaultNotSupported, match="rdmalab-disk"):
        Srp(UlpLab(answers=answers(disk_by_serial={"device": ""}))).export()


def test_a_failed_host_step_is_a_workload_error_naming_step_and_host():
    failed = {"failed": {"step": "write /sys/class/infiniband_srp/srp-rxe0-1/add_target",
                         "errno": 111, "detail": "Connection refused"}}
    srp = Srp(UlpLab(answers=answers(login=failed)))
    srp.export()
    with pytest.raises(WorkloadError) as e:
        srp.connect()
    assert e.value.host == "b" and e.value.errno == 111


def test_teardown_logs_out_then_removes_the_target_and_leftovers_name_both_owners():
    lab = UlpLab(answers=answers(logout={}, target_down={"took_s": 0.5},
                                 kernel_owned={"held": {}}))
    srp = Srp(lab)
    srp.rport = "port-3:1"
    srp.teardown(30.0)
    assert [(c[0], c[2]) for c in lab.calls] == [("b", "logout"), ("a", "target_down")]
    assert srp.leftovers() == {}
    owners = {c[0]: c[3][0] for c in lab.calls if c[2] == "kernel_owned"}
    assert owners == {"a": ["ib_srpt", "rdma_cm"], "b": ["ib_srp", "rdma_cm"]}


def test_an_iwarp_target_is_logged_in_to_at_its_link_local_address():
    """ib_srpt's listener is an IPv6 one; on siw an IPv4 login is reset (IPV4_ON_IWARP)."""
    lab = UlpLab(answers=answers(), device=("siw0", "iWARP"))
    srp = Srp(lab)
    srp.wait_for = lambda pred, timeout_s, what: pred() or pytest.fail(what)
    srp.setup()
    options = next(c[3][0] for c in lab.calls if c[2] == "login")
    assert "dest=[fe80::a%3]:5555" in options and options.endswith("src=[fe80::b%3]")


def test_an_iwarp_pair_without_link_local_addresses_is_a_skip_naming_why():
    no_ll = {"device": "siw0", "port": 1, "gid": GID_B, "link_local": "", "ifindex": 3}
    srp = Srp(UlpLab(answers=answers(port_of=no_ll), device=("siw0", "iWARP")))
    srp.export()
    with pytest.raises(FaultNotSupported, match="srpt_rdma_cm_port_store"):
        srp.connect()


def test_the_link_local_address_is_read_from_ip_addr():
    info = [{"family": "inet", "local": "10.0.0.1", "scope": "global"},
            {"family": "inet6", "local": "fe80::5054:ff:fe12:3401", "scope": "link"}]
    assert srp_host.link_local(info) == "fe80::5054:ff:fe12:3401"
    assert srp_host.link_local(info[:1]) == ""
