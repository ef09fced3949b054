"""The one front-end of wire faults (rdmalab.faults.wire): every verb builds the switch's rule
object, the sink chosen by at= may refuse it by name, the switch's parser checks it, and only
then does the sink install it."""

import pytest

from rdmalab import FaultNotSupported, model_lab
from rdmalab.faults.wire import WireFaults
from rdmalab.labs.agent.sinks import NftSink


class Sink:
    def __init__(self, refuse=None):
        self.added, self.refuse = [], refuse

    def refusal(self, spec):
        return self.refuse

    def add(self, spec):
        self.added.append(spec)
        return spec


class Lab(WireFaults):
    def __init__(self, sink):
        self.sink, self.asked = sink, []

    def _wire_sink(self, at):
        self.asked.append(at)
        return self.sink


def test_each_verb_gives_the_switchs_rule_object_to_the_sink():
    f = Lab(Sink())
    f.drop(cm="DREP", count=2)
    f.delay(opcode="SEND_ONLY", delay_ns=5, probability=0.5)
    f.reorder(dest_qpn=7, hold_ns=9, at="switch")
    f.watch(cm="DREQ")
    f.corrupt(opcode="SEND_ONLY", layer="bth", offset=4)
    assert f.sink.added == [
        {"action": "drop", "cm": "DREP", "count": 2},
        {"action": "delay", "opcode": "SEND_ONLY", "delay_ns": 5, "probability": 0.5},
        {"action": "reorder", "dest_qpn": 7, "hold_ns": 9},
        {"action": "watch", "cm": "DREQ"},
        {"action": "corrupt", "opcode": "SEND_ONLY", "layer": "bth", "offset": 4, "xor": 255}]
    assert f.asked == [None, None, "switch", None, None]


def test_a_bad_key_is_the_parsers_error_on_every_sink():
    f = Lab(Sink())
    with pytest.raises(ValueError, match="rule.opcode: unknown opcode 'SEND_ONYL'"):
        f.drop(opcode="SEND_ONYL")
    with pytest.raises(ValueError, match="rule.bogus: unknown key"):
        f.rule({"action": "watch", "bogus": 1})
    assert f.sink.added == []


def test_a_sinks_refusal_names_the_action_and_why():
    f = Lab(Sink(refuse="no bytes here"))
    with pytest.raises(FaultNotSupported, match="corrupt.*no bytes here"):
        f.corrupt(layer="bth", offset=0)
    assert f.sink.added == []


def test_misuse_is_refused_before_any_sink():
    f = Lab(Sink())
    with pytest.raises(ValueError, match="at='wire'"):
        f.drop(cm="REP", at="wire")
    with pytest.raises(TypeError, match="a Python predicate would run for every packet"):
        f.drop(lambda p: True)
    with pytest.raises(TypeError, match="a dict"):
        f.rule("drop")
    assert f.sink.added == [] and f.asked == []


@pytest.mark.parametrize("spec, why", [
    ({"action": "delay", "delay_ns": 5}, "delay needs the fault switch"),
    ({"action": "drop", "count": 1}, "count= needs the fault switch"),
    ({"action": "drop", "every": 2}, "every=/probability= need the fault switch"),
    ({"action": "watch", "cm": "REP"}, None),
])
def test_nftables_takes_drops_and_watches_by_match_keys_only(spec, why):
    got = NftSink(None, "host").refusal(spec)
    assert got is None if why is None else why in got


def test_the_models_fabric_is_the_whole_path():
    with model_lab(seed=1) as lab:
        rule = lab.faults.drop(cm="DREP", at="switch")
        assert rule.hits == 0
        with pytest.raises(FaultNotSupported, match="no nftables"):
            lab.faults.drop(cm="DREP", at="host")
        with pytest.raises(FaultNotSupported, match="carries packets, not bytes"):
            lab.faults.corrupt(layer="bth", offset=0)
