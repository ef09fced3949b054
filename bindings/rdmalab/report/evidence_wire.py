"""The wire in a scenario's evidence bundle (rdmalab.report.evidence): the capture for the
scenario's time (the fault switch's own, or tcpdump on the netns lab's bridge in the outer
machine), written as wire.pcap and decoded into `wire` history records by the switch's own
frame parser (rdmalab-switch --decode-pcap: the one home of frame parsing)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import time
from typing import Callable, Optional

from ..faults.fabric import SwitchControl
from ..machines import netns
from ..paths import switch_binary

MAX_PCAP_BYTES = 8 << 20   # a bulk-data scenario's capture stops growing here
MAX_WIRE_RECORDS = 2000    # frames decoded into `wire` history records at most

_CAPTURING: dict = {}  # switch control path or bridge -> the WireCapture that runs there


def decode_pcap(path, max_frames: int = MAX_WIRE_RECORDS, timeout_s: float = 30.0
                ) -> tuple[list[dict], dict]:
    """The switch's frame parser over a capture (rdmalab-switch --decode-pcap): one dict
    {i, t_ns, frame} a frame, and the end line {frames, decoded, torn}."""
    binary = switch_binary()
    if not binary.exists():
        raise FileNotFoundError(f"{binary}: the frame decoder is not built "
                                "(cmake --build build --target rdmalab-switch)")
    r = subprocess.run([str(binary), "--decode-pcap", str(path), "--max-frames",
                        str(max_frames)], capture_output=True, text=True, timeout=timeout_s)
    if r.returncode != 0:
        raise RuntimeError(f"{binary.name} --decode-pcap {path}: rc {r.returncode}: "
                           f"{r.stderr.strip()[-500:]}")
    frames, end = [], {}
    for line in r.stdout.splitlines():
        d = json.loads(line)
        if d.get("end"):
            end = d
        else:
            frames.append(d)
    return frames, end


def wire_records(frames: list[dict], macs: dict[str, str], where: str,
                 to_lab_ns: Callable[[int], int]) -> list[dict]:
    """`wire` history records of decoded frames: host `where` ("switch", "bridge"), the lab
    hosts the MACs name (dst "" for broadcast or unknown), t_ns on the lab's time line."""
    by_mac = {m.lower(): h for h, m in macs.items() if m}
    out = []
    for f in frames:
        frame = f.get("frame", {})
        out.append({"t_ns": to_lab_ns(int(f["t_ns"])), "host": where, "object": "frame",
                    "kind": "wire",
                    "data": {"src_host": by_mac.get(str(frame.get("src", "")).lower(), ""),
                             "dst_host": by_mac.get(str(frame.get("dst", "")).lower(), ""),
                             "i": f.get("i"), "frame": frame}})
    return out


class WireCapture:
    """One bundle's capture: start() at the lab's start, stop() after its shutdown. A test's
    second lab on the same wire gets no capture of its own (one capture a wire at a time).
    caps and files are the bundle's (rdmalab.report.evidence.Collector); agent_call(host, fn,
    *args) is a call of rdmalab.report.evidence_host.fn in that host's agent."""

    def __init__(self, lab, hosts: list[str], directory: Callable[[], pathlib.Path],
                 agent_call: Callable[..., Callable[[], object]], caps: dict, files: dict):
        # directory(): the bundle's folder now (a test's second lab renames the first's)
        self.lab, self.hosts, self.directory = lab, hosts, directory
        self._agent_call, self.caps, self.files = agent_call, caps, files
        self._running = None      # ("switch", SwitchControl) or ("bridge", netns.BridgeCapture)
        self._key = ""
        self._bridge_offset = 0

    def start(self) -> None:
        path = self.lab.switch_path()
        m = self.lab.machine_of(self.hosts[0])
        bridge = m.bridge
        key = path if path else f"{(m.bridge_machine or m).name}:{bridge}"
        other = _CAPTURING.get(key)
        if other is not None:  # a test's second lab on the same wire: one capture at a time
            self.caps["wire"] = (f"no capture of its own: the wire's capture is in "
                                 f"{other.directory().name}'s bundle")
            return
        self._key = key
        if path:
            control = SwitchControl(path)
            control.request("pcap", path=str((self.directory() / "wire.pcap").resolve()),
                            max_bytes=MAX_PCAP_BYTES)
            self._running = ("switch", control)
            _CAPTURING[key] = self
            return
        if m.bridge_machine is not None and bridge:
            cap = netns.BridgeCapture.shared(m.bridge_machine, bridge,
                                             max_bytes=MAX_PCAP_BYTES)
            reader = self.hosts[0]
            self._bridge_offset = cap.mark(probe=lambda path, pid: self._agent_call(
                reader, "capture_state", path, pid)())
            self._running = ("bridge", cap)
            _CAPTURING[key] = self
            return
        self.caps["wire"] = "no capture: no fault switch or bridge on the hosts' path"

    def stop(self, clock: Optional[tuple[int, int, int]]) -> list[dict]:
        """The scenario's frames as `wire` records (none when nothing was captured). clock:
        (realtime, monotonic, agent offset) of a host at the lab's start: the bridge's
        capture stamps frames with its machine's realtime clock."""
        if self._running is None:
            return []
        where, cap = self._running
        self._running = None
        _CAPTURING.pop(self._key, None)
        pcap = self.directory() / "wire.pcap"  # the switch's open file moved with it
        if where == "switch":
            to_lab, what = self._stop_switch(cap)
        else:
            to_lab, what = self._stop_bridge(cap, pcap, clock)
        if not pcap.exists():
            raise RuntimeError(f"{pcap.name}: the capture wrote no file")
        self.files["wire.pcap"] = what
        frames, end = decode_pcap(pcap)
        if end.get("frames", 0) > end.get("decoded", 0):
            self.caps["wire"] = (f"{end['decoded']} of {end['frames']} frames decoded into "
                                 f"wire records (MAX_WIRE_RECORDS)")
        macs = {h: self.lab.machine_of(h).facts.mac for h in self.hosts}
        return wire_records(frames, macs, where, to_lab)

    def _stop_switch(self, control: SwitchControl) -> tuple[Callable[[int], int], str]:
        try:
            closed = control.request("pcap", path=None).get("closed") or {}
        finally:
            control.close()
        if closed.get("skipped"):
            self.caps["pcap"] = (f"capped at {MAX_PCAP_BYTES} bytes: {closed['frames']} "
                                 f"frames kept, {closed['skipped']} later ones not")
        offset = time.time_ns() - time.monotonic_ns()  # the switch runs here

        def to_lab(t_ns: int) -> int:
            return t_ns - offset - self.lab.t0_ns
        return to_lab, "the fault switch's capture (every frame it received) for the scenario"

    def _stop_bridge(self, cap: "netns.BridgeCapture", pcap: pathlib.Path,
                     clock: Optional[tuple[int, int, int]]
                     ) -> tuple[Callable[[int], int], str]:
        reader = next((h for h in self.hosts if h not in self.lab.lost_hosts()), None)
        read = None if reader is None else (lambda path, off, n, pid: self._agent_call(
            reader, "file_part", path, off, n, pid)())
        stats = cap.take(self._bridge_offset, str(pcap), read=read)
        if stats.get("capped"):
            self.caps["pcap"] = f"capped at {stats['capped']}"
        if clock is None:
            raise RuntimeError("no clock of the bridge's machine: no host answered")
        rt, mono, off = clock

        def to_lab(t_ns: int) -> int:
            return t_ns - (rt - mono) + off - self.lab.t0_ns
        return to_lab, f"tcpdump on the bridge {cap.bridge} in {cap.machine.name} for the scenario"
