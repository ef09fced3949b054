"""Kernel logs as an oracle (rdmalab.findings.kernlog): the splat parser on dmesg text as the kernel
prints it, /dev/kmsg records, and the findings registry's kernel_log expectations (only on the
entry's drivers and kernels)."""

import textwrap

import pytest

from rdmalab.findings import registry as findings, kernlog

WARN = """\
[  101.000001] rxe0: qp#17 moved to error state
[  101.204518] ------------[ cut here ]------------
[  101.204533] WARNING: CPU: 0 PID: 412 at drivers/infiniband/sw/rxe/rxe_comp.c:598 rxe_completer+0x6f1/0xaf0 [rdma_rxe]
[  101.204601] Modules linked in: rdma_rxe ib_uverbs ip6_udp_tunnel udp_tunnel rdma_ucm ib_core
[  101.204690] CPU: 0 PID: 412 Comm: kworker/u2:1 Not tainted 6.1.0-56-amd64 #1  Debian 6.1.192-2
[  101.204702] Hardware name: QEMU Standard PC (i440FX + PIIX, 1996), BIOS 1.16.2-debian-1.16.2-1 04/01/2014
[  101.204720] RIP: 0010:rxe_completer+0x6f1/0xaf0 [rdma_rxe]
[  101.204800] Call Trace:
[  101.204802]  <TASK>
[  101.204810]  rxe_run_task+0x2a/0x80 [rdma_rxe]
[  101.204830]  process_one_work+0x1c4/0x380
[  101.204850]  </TASK>
[  101.204852] ---[ end trace 0000000000000000 ]---
[  101.300000] rxe0: this line comes after the trace
"""

KASAN = """\
[   55.100000] ==================================================================
[   55.100010] BUG: KASAN: slab-use-after-free in rxe_cq_post+0x1d2/0x200 [rdma_rxe]
[   55.100020] Read of size 8 at addr ffff888004c3a010 by task kworker/0:2/77
[   55.100030] Call Trace:
[   55.100040]  kasan_report+0xbd/0xf0
[   55.100050] ==================================================================
"""

UBSAN = """\
[   12.000000] UBSAN: array-index-out-of-bounds in drivers/infiniband/sw/siw/siw_qp_tx.c:447:17
[   12.000010] index 5 is out of range for type 'struct siw_sge [4]'
[   12.000020] ---[ end trace ]---
"""

HUNG = """\
[  242.870001] INFO: task kworker/u2:3:95 blocked for more than 120 seconds.
[  242.870010]       Not tainted 6.1.0-56-amd64 #1 Debian 6.1.192-2
[  242.870020] "echo 0 > /proc/sys/kernel/hung_task_timeout_secs" disables this message.
[  242.870030] task:kworker/u2:3    state:D stack:0     pid:95    ppid:2      flags:0x00004000
"""

RCU = """\
[  300.000001] rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:
[  300.000010] rcu: \t0-...!: (1 GPs behind) idle=d6c/1/0x4000000000000000 softirq=1/1 fqs=0
[  400.000001] INFO: rcu_sched detected stalls on CPUs/tasks: { 0} (detected by 1, t=5252 jiffies)
"""

INNOCENT = """\
[    0.000000] Linux version 6.1.0-56-amd64 (debian-kernel@lists.debian.org)
[    1.000000] rxe: WARNING-free since the last reset
[    1.100000] audit: type=1400 audit(1700000000.123:42): apparmor="STATUS" operation="profile_load" name="WARNING: BUG: in a name"
[    1.200000] systemd[1]: Reached target BUG: not really, a unit description
[    1.300000] ib_core: Warning: a lower-case warning is no splat
[    1.400000] rdma_rxe: loaded
[    1.500000] usb 1-1: rcu_sched was mentioned but nothing stalled
"""


def kinds(text):
    return [(s.kind, s.first_line) for s in kernlog.find_splats(kernlog.from_dmesg(text))]


def test_warning_splat_runs_from_its_header_to_the_end_trace_marker():
    splats = kernlog.find_splats(kernlog.from_dmesg(WARN))
    assert len(splats) == 1
    s = splats[0]
    assert s.kind == "warning"
    assert s.first_line.startswith("WARNING: CPU: 0 PID: 412 at drivers/infiniband/sw/rxe/")
    assert s.ended
    assert s.lines[-1].text.startswith("---[ end trace")
    assert len(s.lines) == 11  # the header through the marker; not the line after it
    assert s.lines[0].ts_us == 101_204_533
    assert "rxe_run_task" in s.text
    assert "after the trace" not in s.dmesg()


def test_every_kind_of_report_is_found_and_innocent_lines_are_not():
    found = kinds(WARN + KASAN + UBSAN + HUNG + RCU)
    assert [k for k, _ in found] == ["warning", "bug", "ubsan", "hung_task", "rcu_stall",
                                     "rcu_stall"]
    assert found[1][1].startswith("BUG: KASAN: slab-use-after-free in rxe_cq_post")
    assert found[3][1].startswith("INFO: task kworker/u2:3:95 blocked for more than 120")
    assert kinds(INNOCENT) == []


@pytest.mark.parametrize("line,kind", [
    ("BUG: kernel NULL pointer dereference, address: 0000000000000008", "bug"),
    ("kernel BUG at drivers/infiniband/core/cma.c:1234!", "bug"),
    ("Oops: 0002 [#1] PREEMPT SMP NOPTI", "oops"),
    ("general protection fault, probably for non-canonical address 0xdead: 0000 [#1] SMP",
     "oops"),
    ("watchdog: BUG: soft lockup - CPU#0 stuck for 22s! [kworker/0:1:33]", "bug"),
    ("WARNING: possible circular locking dependency detected", "warning"),
    ("Kernel panic - not syncing: Fatal exception", "panic"),
    ("rxe0: WARNING would be a driver's own word", None),
    ("BUGGY: no colon-space", None),
])
def test_start_lines(line, kind):
    assert kernlog.splat_kind(line) == kind


def test_a_splat_without_an_end_marker_stops_at_the_next_start_or_the_bound():
    text = HUNG + KASAN
    splats = kernlog.find_splats(kernlog.from_dmesg(text))
    assert [s.kind for s in splats] == ["hung_task", "bug"]
    assert len(splats[0].lines) == 5 and not splats[0].ended  # up to KASAN's "====" line
    many = "[1.0] WARNING: CPU: 0 PID: 1 at x.c:1 f+0x1/0x2\n" + "".join(
        f"[1.{i:06d}] frame {i}\n" for i in range(1, 500))
    s = kernlog.find_splats(kernlog.from_dmesg(many), max_lines=40)
    assert len(s) == 1 and len(s[0].lines) == 40


def test_kmsg_records_parse_with_sequence_level_and_time():
    line = kernlog.parse_record("4,1234,101204533,-,caller=T412;WARNING: CPU: 0 PID: 412 at "
                                "x.c:1 f+0x1/0x2\n SUBSYSTEM=rxe\n")
    assert (line.seq, line.ts_us, line.level, line.level_name) == (1234, 101204533, 4,
                                                                   "warning")
    assert line.text == "WARNING: CPU: 0 PID: 412 at x.c:1 f+0x1/0x2"
    assert kernlog.parse_record("garbage without a semicolon") is None
    assert kernlog.parse_record("x,y,z;text") is None
    # What a bundle writes (`dmesg -r` form) reads back with its levels.
    back = kernlog.from_dmesg("<4>[  101.204533] WARNING: CPU: 0 PID: 1 at x.c:1 f\n")
    assert back[0].level == 4 and back[0].ts_us == 101204533


def test_kmsg_of_this_machine_reads_after_the_mark(tmp_path):
    mark = kernlog.kmsg_mark()
    if mark["error"]:
        pytest.skip(f"this machine's kernel log cannot be read: {mark['error']}")
    got = kernlog.kmsg_since(mark)
    assert not got["error"] and not got["rebooted"]
    assert all(seq > mark["seq"] for seq, *_ in got["records"])
    earlier = kernlog.kmsg_since({"seq": mark["seq"] - 3, "boot_id": mark["boot_id"]})
    assert [r[0] for r in earlier["records"][:3]] == [mark["seq"] - 2, mark["seq"] - 1,
                                                      mark["seq"]]
    other_boot = kernlog.kmsg_since({"seq": mark["seq"], "boot_id": "another-boot"})
    assert other_boot["rebooted"] and other_boot["records"][0][0] < mark["seq"]


# -- the registry's kernel_log

ENTRY = """
["rxe-warns-in-completer"]
kind = "unclassified"
provider = "rxe"
summary = "rxe's completer WARNs when a QP errs with WQEs in flight"
kernels = { reproduces = ["6.1.192"], since = "v6.0: x", fixed = "v6.12: y" }
reproducer = "pytest tests/scenarios/test_x.py::test_y --lab vm:rxe"
scenario = "tests/scenarios/test_x.py::test_y"
kernel_log = ["^WARNING: .* at drivers/infiniband/sw/rxe/rxe_comp\\\\.c"]
"""


def test_registry_expects_a_splat_on_the_entrys_driver_and_kernels_only():
    reg = findings.parse(textwrap.dedent(ENTRY), "reg.toml")
    splat = kernlog.find_splats(kernlog.from_dmesg(WARN))[0]
    assert reg.expected_splat("rxe", "6.1.0-56-amd64", splat.text).id == "rxe-warns-in-completer"
    assert reg.expected_splat("rxe", "6.12.117+deb13-amd64", splat.text) is None  # fixed
    assert reg.expected_splat("rxe", "5.10.0-30-amd64", splat.text) is None      # before since
    assert reg.expected_splat("siw", "6.1.0-56-amd64", splat.text) is None       # another driver
    other = kernlog.find_splats(kernlog.from_dmesg(KASAN))[0]
    assert reg.expected_splat("rxe", "6.1.0-56-amd64", other.text) is None       # another splat


@pytest.mark.parametrize("value,message", [
    ('"^WARNING"', "a non-empty list of regexes"),
    ("[]", "a non-empty list of regexes"),
    ('["(unclosed"]', "'(unclosed' is not a regex"),
    ("[1]", "a non-empty list of regexes"),
])
def test_registry_refuses_a_bad_kernel_log_naming_the_entry_and_field(value, message):
    text = textwrap.dedent(ENTRY).replace(
        'kernel_log = ["^WARNING: .* at drivers/infiniband/sw/rxe/rxe_comp\\\\.c"]',
        f"kernel_log = {value}")
    with pytest.raises(findings.FindingsError) as e:
        findings.parse(text, "reg.toml")
    assert "[rxe-warns-in-completer] kernel_log: " in str(e.value)
    assert message in str(e.value)
