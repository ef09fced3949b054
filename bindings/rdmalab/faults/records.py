"""The history records of wire actions: one vocabulary on every backend. The model's fabric
writes them in C++ (core/model/fabric.cc); the fault switch keeps its own log, which an agent
lab's history turns into the same records here (from_switch).

  fault            a rule acted on a packet: data.fault (drop, delay, duplicate, reorder,
                   corrupt, watch), data.rule (the rule's id), data.packet (the packet's id on
                   its backend: the model's packet number, the switch's record seq); a packet
                   that waits for a reorder_release is a reorder, or says data.held (the switch
                   holds delayed frames too; the model's fabric delivers a delayed packet at
                   its time and records nothing more). The model adds the packet's fields (src,
                   dst, opcode, ...), the switch its decoded frame (data.frame).
  reorder_release  a held packet let go: data.packet (the held packet's id), data.released_by:
                   packet (the next packet of its flow passed), deadline (hold_ns ran out),
                   delay_elapsed, dropped_at_shutdown (the switch's).
  wire_rule        an agent lab installed a rule (object "switch" or "nft"): data.fault (its
                   action), data.rule (the switch's rule object) or data.fields and data.expr
                   (nftables). The model's rules are in its engine (lab.faults.rules()).
"""

from __future__ import annotations

WIRE_ACTIONS = ("drop", "delay", "duplicate", "reorder", "corrupt", "watch")
SWITCH = "switch"  # the host and object of the switch's records
# The switch's release reasons as the model's fabric names them.
_RELEASED_BY = {"next_frame": "packet", "hold_deadline": "deadline"}


def wire_action(record: dict) -> str:
    """The action of a wire-action fault record ("" for any other record)."""
    if record["kind"] != "fault":
        return ""
    action = record["data"].get("fault")
    return action if action in WIRE_ACTIONS and "packet" in record["data"] else ""


def holds(data: dict) -> bool:
    """Whether a wire-action record's packet waits for a reorder_release."""
    return data.get("fault") == "reorder" or bool(data.get("held"))


def from_switch(r: dict, t0_ns: int) -> dict:
    """A record of the fault switch's log (seq, t_ns on this machine's clock, action, rule,
    frame, of_seq, reason, held_ns) as a history record of the lab whose clock starts at
    t0_ns. Its seq is the merged history's to give."""
    action = r.get("action", "")
    if action == "release":
        kind = "reorder_release"
        data = {**r, "packet": r.get("of_seq"),
                "released_by": _RELEASED_BY.get(r.get("reason"), r.get("reason"))}
    else:
        kind = "fault"
        data = {**r, "fault": action, "packet": r.get("seq")}
        if action in ("delay", "reorder"):
            data["held"] = True
    return {"seq": 0, "host_seq": r.get("seq", 0), "t_ns": r.get("t_ns", 0) - t0_ns,
            "host": SWITCH, "object": SWITCH, "kind": kind, "data": data}
