"""The handles of wire rules an agent lab's faults install: NftRule (nftables in the hosts or
the bridge on their path) and SwitchRule (the fault switch)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .faults import AgentFaults


class NftRule:
    """A wire rule installed as nftables rules (rdmalab.faults.nft): in the sending hosts' output hooks
    or in the bridge on their path. `hits` is what their counters saw; `remove()` takes them
    out."""

    def __init__(self, faults: "AgentFaults", action: str, fields: dict, installed: dict):
        self.action, self.fields = action, fields
        # place key (a host name, or "bridge:<machine>") -> (machine, nft place, handle)
        self._faults, self._installed = faults, installed

    @property
    def hits(self) -> int:
        from ...faults import nft
        total = 0
        for key, (machine, place, handle) in self._installed.items():
            total += nft.rule_packets(self._faults._nft_list(machine, key, place), handle)
        return total

    def remove(self) -> None:
        from ...faults import nft
        for key, (machine, place, handle) in list(self._installed.items()):
            self._faults._nft_on(machine, key, nft.delete_rule_command(handle, place))
            del self._installed[key]

    def __repr__(self) -> str:
        return f"<NftRule {self.action} {self.fields} on {sorted(self._installed)}>"


class SwitchRule:
    """A wire rule in the lab's fault switch: `hits` is the frames it acted on (a watch rule:
    the frames it counted); `remove()` takes it out."""

    def __init__(self, faults: "AgentFaults", action: str, rule: dict, rule_id: int):
        self.action, self.rule, self.id = action, rule, rule_id
        self._faults = faults

    @property
    def hits(self) -> int:
        for r in self._faults._switch().request("rules")["rules"]:
            if r["id"] == self.id:
                return int(r["acted"])
        return self._final_hits

    _final_hits = 0

    def remove(self) -> None:
        self._final_hits = self.hits
        self._faults._switch().request("remove_rule", id=self.id)

    def __repr__(self) -> str:
        return f"<SwitchRule {self.id} {self.rule}>"
