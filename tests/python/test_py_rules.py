"""One rule engine: the model's wire rules are the fault switch's (faults/rules.h), parsed,
validated and matched by the same C++ (core/model/wire_rules.h presents each model packet as the
frame it stands for). The same rule object gives the same error and the same verdict on the
model and on the real switch (build/faults/rdmalab-switch, real frames through its socket); the
switch's keys transport=, port=, direction, proto, tcp_flags, rdmap_opcode, probability (0..1),
count and every work on the model."""

import json
import socket
import subprocess
import time
from types import SimpleNamespace

import pytest

import rdmalab
from rdmalab import FaultNotSupported, _core, ms, sec
from rdmalab.paths import switch_binary
from rdmalab.faults.fabric import SwitchControl, SwitchError
from rdmalab.faults.records import from_switch
from rdmalab.api.resources import CmPair, RCPair

from roce_frames import MAC_A, MAC_B, roce_cm_req  # tests/python/roce_frames.py

DEADLINE_S = 10.0


def ib_lab(seed=1, pers="ib"):
    return rdmalab.model_lab(seed=seed, hosts={"a": pers, "b": pers})


def connect_control(ctl, proc, deadline_s=DEADLINE_S) -> SwitchControl:
    """The switch's control socket once it accepts. Its file appears at bind(), before the
    switch's listen(): a connect in between is refused (ECONNREFUSED), one before the bind finds
    no file (ENOENT); both are retried until the deadline or the switch's exit."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            return SwitchControl(str(ctl))
        except SwitchError as e:
            if not isinstance(e.__cause__, (ConnectionRefusedError, FileNotFoundError)):
                raise
            assert proc.poll() is None, f"the switch exited (rc {proc.returncode}): {e}"
            assert time.monotonic() < end, f"the switch did not accept within {deadline_s} s: {e}"
        time.sleep(0.01)


@pytest.fixture
def switch(tmp_path):
    """The real fault switch with hosts a and b on two fake VM sockets: (control, send(frame)),
    send passing a frame from a to b through it."""
    binary = switch_binary()
    if not binary.exists():
        pytest.skip(f"{binary} is not built (cmake --build build --target rdmalab-switch)")
    sock, ctl = tmp_path / "sw.sock", tmp_path / "sw.ctl"
    ends = {}
    for h in "ab":
        ends[h] = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        ends[h].bind(str(tmp_path / f"{h}.sock"))
        ends[h].settimeout(DEADLINE_S)
    argv = [str(binary), "--sock", str(sock), "--control", str(ctl), "--keep", "--peer",
            str(tmp_path / "a.sock"), "--peer", str(tmp_path / "b.sock")]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    control = None
    try:
        control = connect_control(ctl, proc)
        control.request("hosts", hosts={"a": {"mac": MAC_A}, "b": {"mac": MAC_B}})

        def send(frame):
            ends["a"].sendto(frame, str(sock))
            ends["b"].recv(65536)  # forwarded: the switch has decided it

        yield control, send
    finally:
        if control is not None:
            control.close()
        proc.terminate()
        proc.wait(timeout=DEADLINE_S)
        for s in ends.values():
            s.close()


def test_the_control_socket_is_connected_once_it_listens_not_once_its_file_exists(tmp_path):
    """The window the fixture used to hit under load: the file is there, nothing listens yet."""
    import threading
    ctl = tmp_path / "sw.ctl"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(ctl))  # the file exists: a connect now is refused
    with pytest.raises(SwitchError) as refused:
        SwitchControl(str(ctl))
    assert isinstance(refused.value.__cause__, ConnectionRefusedError)
    later = threading.Timer(0.2, srv.listen, args=(1,))
    later.start()
    try:
        control = connect_control(ctl, SimpleNamespace(poll=lambda: None, returncode=None))
        control.close()
        with pytest.raises(AssertionError, match="did not accept within"):
            connect_control(tmp_path / "none.ctl", SimpleNamespace(poll=lambda: None),
                            deadline_s=0.05)
    finally:
        later.join()
        srv.close()


# Each key of the switch beside cm="REQ": what the REQ from a to b is, and what it is not.
REQ_KEYS = [{}, {"transport": "UD"}, {"transport": "RC"}, {"port": 4791}, {"port": 7471},
            {"opcode": "MAD"}, {"opcode": 0x04}, {"opcode": 0x64}, {"dest_qpn": 1},
            {"dest_qpn": 2}, {"src_qpn": 1}, {"direction": "a->b"}, {"direction": "b->a"},
            {"direction": "a<->b"}, {"src_host": "b"}, {"proto": "roce"}, {"proto": "tcp"},
            {"mad_attr_id": 0x10}, {"tcp_flags": "ACK"}, {"rdmap_opcode": "SEND"},
            {"syndrome": "ACK"}]


def test_each_key_takes_the_cm_req_on_the_model_as_the_switch_takes_the_real_frame(switch):
    control, send = switch
    specs = [{"action": "watch", "cm": "REQ", **k} for k in REQ_KEYS]
    ids = [control.request("add_rule", rule=spec)["id"] for spec in specs]
    send(roce_cm_req())
    on_switch = {r["id"]: r["acted"] for r in control.request("rules")["rules"]}
    with ib_lab(pers="roce") as lab:
        rules = [lab.faults.rule(spec) for spec in specs]
        CmPair(lab)  # a connects to b: one REQ
        for spec, rid, rule in zip(specs, ids, rules):
            assert on_switch[rid] in (0, 1), spec
            assert rule.hits == on_switch[rid], f"{spec}: model {rule.hits}, switch " \
                                                f"{on_switch[rid]}"
    assert sum(on_switch.values()) >= 10  # most keys describe the REQ: the test can tell


class SwitchLab:
    """What the VM lab's AgentFaults asks of its lab to put rules in a switch."""

    description = "a VM lab's switch"

    def __init__(self, control_path: str):
        self.path, self.addresses, self.records = control_path, {"a": "10.0.0.1",
                                                                 "b": "10.0.0.2"}, []

    def switch_unusable(self) -> str:
        return ""

    def switch_path(self) -> str:
        return self.path

    def machine_of(self, name):
        facts = SimpleNamespace(mac=MAC_A if name == "a" else MAC_B,
                                data_address=self.addresses[name])
        return SimpleNamespace(facts=facts)

    def record(self, kind, **data):
        self.records.append((kind, data))

    def lost_hosts(self) -> set:
        return set()


def test_the_vm_lab_takes_the_same_rule_object_and_checks_it_first(switch):
    from rdmalab.labs.agent import AgentFaults
    control, send = switch
    faults = AgentFaults(SwitchLab(control.path))
    spec = {"action": "watch", "cm": "REQ", "transport": "UD"}
    rule = faults.rule(spec)
    with pytest.raises(ValueError, match="rule.opcode: unknown opcode 'SEND_ONYL'"):
        faults.rule({"action": "drop", "opcode": "SEND_ONYL"})  # refused before it is sent
    send(roce_cm_req())
    assert rule.hits == 1 and rule.rule == {"cm": "REQ", "transport": "UD", "action": "watch"}
    assert [r["rule"] for r in control.request("rules")["rules"]] == [rule.rule]
    with ib_lab(pers="roce") as lab:
        same = lab.faults.rule(spec)
        CmPair(lab)
        assert same.hits == rule.hits
    faults.clear()


BAD_RULES = [
    ({"action": "drop", "opcode": "SEND_ONYL"}, "rule.opcode: unknown opcode 'SEND_ONYL'"),
    ({"action": "drop", "cm": "DREQQ"}, "rule.cm: unknown CM message"),
    ({"action": "drop", "transport": "RCX"}, "rule.transport: expected RC, UC"),
    ({"action": "drop", "probability": 50}, "rule.probability: expected a number in 0..1"),
    ({"action": "drop", "every": 0}, "rule.every: expected at least 1"),
    ({"action": "drop", "qpn": 3}, "rule.qpn: unknown key"),
    ({"action": "drop", "direction": "a-b"}, "rule.direction: expected"),
    ({"action": "drop", "tcp_flags": "FIN|NOPE"}, "rule.tcp_flags: unknown TCP flag 'NOPE'"),
    ({"action": "reorder", "delay_ns": 5}, "rule.delay_ns: only for action delay"),
    ({"action": "explode"}, "rule.action: unknown action 'explode'"),
]


@pytest.mark.parametrize("spec,message", BAD_RULES, ids=[m for _, m in BAD_RULES])
def test_a_bad_rule_is_the_same_clear_error_on_the_model_and_on_the_switch(switch, spec,
                                                                        message):
    control, _ = switch
    with pytest.raises(SwitchError) as on_switch:
        control.request("add_rule", rule=spec)
    with ib_lab() as lab, pytest.raises(ValueError) as on_model:
        lab.faults.rule(spec)
    assert message in str(on_model.value)
    assert str(on_model.value) in str(on_switch.value)
    with pytest.raises(ValueError) as checked:  # what the VM lab checks before sending
        _core.check_wire_rule(json.dumps(spec))
    assert str(checked.value) == str(on_model.value)


def test_the_fault_verbs_take_the_switch_keys_and_refuse_what_the_model_cannot_do():
    with ib_lab() as lab:
        with pytest.raises(ValueError, match="rule.opcode: unknown opcode 'SEND_ONYL'"):
            lab.faults.drop(opcode="SEND_ONYL")  # once silently matching nothing
        with pytest.raises(ValueError, match="rule.probability"):
            lab.faults.drop(probability=50)  # 0..1, as the switch (no ppm)
        with pytest.raises(ValueError, match="rule.colour: unknown key"):
            lab.faults.drop(colour="red")
        with pytest.raises(TypeError, match="a Python predicate would run for every packet"):
            lab.faults.drop(lambda p: True)
        with pytest.raises(FaultNotSupported, match="carries packets, not bytes"):
            lab.faults.rule({"action": "corrupt", "layer": "bth", "offset": 0})
        assert lab.faults.rules() == []
    with ib_lab(pers="iwarp-siw") as lab:
        with pytest.raises(ValueError, match="rule.port: the model's iWARP packets carry no TCP"):
            lab.faults.drop(port=7471)


def send_n(lab, n):
    """n SENDs from a to b on one RC pair, each received."""
    pair = RCPair(lab, max_send_wr=n + 1, max_recv_wr=n + 1, cqe=4 * n)
    for _ in range(n):
        pair.b.post_recv(length=8)
    for _ in range(n):
        pair.a.post_send(length=8)
    assert pair.b.wait_completions(n, sec(5)) and pair.a.wait_completions(n, sec(5))
    return pair


def test_transport_and_port_take_what_the_packets_stand_for():
    with ib_lab(pers="roce") as lab:
        rc = lab.faults.watch(transport="RC", opcode="SEND_ONLY")
        ud = lab.faults.watch(transport="UD", opcode="SEND_ONLY")  # a MAD is "MAD", not a SEND
        roce_port = lab.faults.watch(port=4791)
        other_port = lab.faults.watch(port=4792)
        acks = lab.faults.watch(transport="RC", opcode="ACKNOWLEDGE", syndrome="ACK")
        send_n(lab, 3)
        assert (rc.hits, ud.hits, other_port.hits) == (3, 0, 0)
        assert acks.hits >= 1 and roce_port.hits >= rc.hits + acks.hits


def test_count_every_and_probability_as_the_switch_counts_them():
    with ib_lab() as lab:
        every = lab.faults.watch(opcode="SEND_ONLY", every=3)
        first = lab.faults.rule({"action": "watch", "opcode": "SEND_ONLY", "count": 2})
        never = lab.faults.drop(opcode="SEND_ONLY", probability=0.0)
        send_n(lab, 7)
        assert (every.hits, first.hits, never.hits) == (2, 2, 0)
        counters = {r["id"]: r for r in lab.faults.rules()}
        assert counters[every.id]["matched"] == 7 and counters[first.id]["matched"] == 7

    def duplicates(seed):
        with ib_lab(seed=seed) as lab:
            rule = lab.faults.duplicate(opcode="SEND_ONLY", probability=0.5)
            send_n(lab, 40)
            return rule.hits, [r["data"]["psn"] for r in lab.history() if r["kind"] == "fault"
                               and r["data"]["fault"] == "duplicate"]

    assert duplicates(7) == duplicates(7)  # the lab's seed replays the draws
    hits, psns = duplicates(7)
    assert 8 < hits < 32 and len(psns) == hits and duplicates(7) != duplicates(8)


def test_a_removed_rule_keeps_its_hits_and_takes_nothing_more():
    with ib_lab() as lab:
        rule = lab.faults.watch(opcode="SEND_ONLY")
        pair = send_n(lab, 2)
        rule.remove()
        pair.b.post_recv(length=8)
        pair.a.post_send(length=8)
        assert pair.b.wait_completions(1, ms(10))
        assert rule.hits == 2 and lab.faults.rules() == []


def test_fin_rule_drops_exactly_the_fins_on_iwarp():
    """A client's close on iWARP with every FIN lost: the server hears nothing until the
    client's endpoint gives up and aborts (its RST has no FIN bit and goes through): cxgb4,
    whose close waits (siw reports it at once and leaves the peer half-open)."""
    with rdmalab.model_lab(seed=3, hosts={"a": "iwarp-cxgb4", "b": "iwarp-cxgb4"}) as lab:
        pair = CmPair(lab)
        fin_segments = lab.faults.watch(opcode="TCP_FIN")
        rst_segments = lab.faults.watch(opcode="TCP_RST")
        fins = lab.faults.drop(tcp_flags="FIN")
        pair.client.conn.disconnect()
        lab.run_for(ms(100))
        assert fin_segments.hits == fins.hits == 1
        assert pair.server.conn.count("DISCONNECTED") == 0
        pair.server.conn.wait("DISCONNECTED", sec(61))  # the iWARP endpoint timeout, then RST
        assert rst_segments.hits >= 1 and fins.hits == fin_segments.hits
        drops = [r["data"] for r in lab.history() if r["kind"] == "fault"
                 and r["data"]["fault"] == "drop"]
        assert [d["opcode"] for d in drops] == ["TCP_FIN"]


def test_rdmap_opcode_takes_the_iwarp_send_and_terminate():
    with rdmalab.model_lab(seed=3, hosts={"a": "iwarp-siw", "b": "iwarp-siw"}) as lab:
        pair = CmPair(lab)
        sends = lab.faults.watch(rdmap_opcode="SEND")
        terminates = lab.faults.watch(rdmap_opcode="TERMINATE")
        pair.server.post_recv(length=8)
        pair.client.post_send(length=8)
        assert pair.server.wait_completions(1, ms(10)) and pair.client.wait_completions(1, ms(10))
        assert (sends.hits, terminates.hits) == (1, 0)
        # an RDMA WRITE with a bad rkey: the responder terminates the stream
        pair.client.post_send(length=8, opcode="RDMA_WRITE", remote_addr=pair.server.mr.addr,
                              rkey=pair.server.mr.rkey + 1)
        assert pair.client.wait_completions(1, ms(10))  # siw: at once, handed to TCP
        lab.run_for(ms(1))
        assert terminates.hits == 1


def test_rdmap_opcode_matches_nothing_on_roce():
    with rdmalab.model_lab(seed=3, hosts={"a": "roce", "b": "roce"}) as lab:
        pair = RCPair(lab)
        sends = lab.faults.watch(rdmap_opcode="SEND")
        acks = lab.faults.watch(tcp_flags="ACK")
        pair.b.post_recv(length=8)
        pair.a.post_send(length=8)
        assert pair.b.wait_completions(1, ms(10)) and pair.a.wait_completions(1, ms(10))
        assert (sends.hits, acks.hits) == (0, 0)


# -- reorder: the switch's hold-until-the-next-of-the-flow

def reorder_run(lab, hold_ns=None):
    """Two SENDs on one RC QP, the first one reordered."""
    pair = RCPair(lab)
    rule = lab.faults.reorder(opcode="SEND_ONLY", count=1, hold_ns=hold_ns)
    pair.a.mr.write(0, b"first...second..")
    for i in range(2):
        pair.b.post_recv(length=8, offset=8 * i, wr_id=20 + i)
    for i in range(2):
        pair.a.post_send(length=8, offset=8 * i, wr_id=10 + i)
    assert pair.a.wait_completions(2, ms(10)) and pair.b.wait_completions(2, ms(10))
    return pair, rule


def test_reorder_delivers_after_the_next_packet_of_the_qp():
    """The first SEND reaches the responder after the second: a sequence gap (NAK_SEQ and a
    go-back-N retransmission), and each message still lands once, in order."""
    with ib_lab() as lab:
        pair, rule = reorder_run(lab)
        history = lab.history()
        held = [r["data"] for r in history if r["kind"] == "fault"
                and r["data"]["fault"] == "reorder"]
        released = [r["data"] for r in history if r["kind"] == "reorder_release"]
        assert rule.hits == 1 and lab.faults.counts()["reorder"] == 1
        assert len(held) == 1 and held[0]["hold_ns"] == ms(100)  # the switch's default
        assert len(released) == 1 and released[0]["packet"] == held[0]["packet"]
        assert released[0]["released_by"] == "packet"
        assert released[0]["after"] == held[0]["packet"] + 1  # the second SEND
        retransmits = [r["data"] for r in history if r["kind"] == "retransmit"]
        assert retransmits and retransmits[0]["cause"] == "NAK_SEQ"
        assert pair.b.mr.read(0, 16) == b"first...second.."
        assert pair.b.traffic.check().exactly_once()


def test_reorder_sends_at_hold_ns_when_the_flow_is_quiet():
    with ib_lab() as lab:
        pair = RCPair(lab)
        lab.faults.reorder(opcode="SEND_ONLY", count=1, hold_ns=ms(5))
        pair.b.post_recv(length=8)
        t0 = lab.now_ns
        pair.a.post_send(length=8)
        assert pair.b.wait_completions(1, ms(10))
        assert lab.now_ns - t0 >= ms(5)
        released = [r["data"] for r in lab.history() if r["kind"] == "reorder_release"]
        assert [r["released_by"] for r in released] == ["deadline"]


def test_reorder_same_seed_same_history():
    def run():
        with ib_lab(seed=9) as lab:
            reorder_run(lab)
            return lab._o.history_jsonl()

    first = run()
    assert '"kind":"reorder_release"' in first and first == run()


def _switch(n, action, **fields):
    """The switch's log entry n as the agent lab's history has it (rdmalab.faults.records)."""
    rec = from_switch({"seq": n, "t_ns": n, "action": action, "rule": 1, **fields}, 0)
    return dict(rec, seq=n)


def test_switch_records_are_the_models_vocabulary():
    held, drop, release = _switch(5, "reorder"), _switch(6, "drop"), _switch(7, "release",
                                                                           of_seq=5,
                                                                           reason="next_frame")
    assert (held["kind"], held["data"]["fault"], held["data"]["packet"]) == ("fault", "reorder", 5)
    assert (drop["kind"], drop["data"]["fault"], drop["host"]) == ("fault", "drop", "switch")
    assert "held" not in drop["data"] and _switch(8, "delay")["data"]["held"] is True
    assert (release["kind"], release["data"]["packet"], release["data"]["released_by"]) == (
        "reorder_release", 5, "packet")


def test_holds_released_checks_each_hold_once():
    from rdmalab.run import checks
    ok = [_switch(5, "reorder"), _switch(6, "delay"), _switch(7, "release", of_seq=6),
          _switch(8, "release", of_seq=5), _switch(9, "drop")]
    assert checks.holds_released(ok)
    lost = ok[:3]
    res = checks.holds_released(lost)
    assert res.valid is False and "packet 5 held" in res.problems[0]
    twice = ok + [_switch(10, "release", of_seq=6)]
    assert checks.holds_released(twice).valid is False
    stray = ok + [_switch(10, "release", of_seq=9)]
    assert checks.holds_released(stray).valid is False
    assert checks.holds_released([]).valid is None


def test_holds_released_on_a_model_history():
    from rdmalab.run import checks
    with ib_lab() as lab:
        reorder_run(lab)
        res = checks.holds_released(lab.history())
        assert res and res.details["held"] == 1
