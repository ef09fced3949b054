"""A scenario's evidence bundle on a device lab (vm:*, netns:*, inventory:*): what the wire,
the kernels and the RDMA stacks of its hosts did while it ran, kept beside its history.

    OUT/evidence/<stem>/
      manifest.json            scenario, column, kernels, files (name -> what it is), splats,
                               caps hit, errors, what the bundle cost
      wire.pcap                the fault switch's capture for the scenario's time (the netns
                               lab: tcpdump on the bridge in the outer machine)
      res-<host>-before.json   `rdma -j res show qp|cm_id|mr|cq|pd` at the lab's start
      res-<host>-after.json    the same at the scenario's end, before the lab shut down
      kmsg-<host>.txt          the host's kernel log since the lab started ("<level>[time] text",
                               as `dmesg -r`), through the lab's shutdown
      switch.jsonl             the switch's rule records (switch_* in the history)
      history.jsonl            a copy of the scenario's history, with `wire` and `kernel_log`
      splat-<host>-<n>.txt     each kernel-log splat found (rdmalab.findings.kernlog)

Collector(lab, dir, ...).begin() at the lab's start, .scenario_end() before its shutdown,
.finish() after it. Every host is asked through its agent with a deadline: a host lost mid-run
gets a note in the manifest, never a hang. The host side (host_begin, host_res, host_end) runs
in the agent, shipped with the package; `rdma res` through one rdma batch process per agent.
"""

from __future__ import annotations

import json
import os
import pathlib
import select
import shutil
import subprocess
import threading
import time
from typing import Callable, Optional

from ..findings import kernlog
from ..errors import Hung
from ..paths import REPO

RES_KINDS = ("qp", "cm_id", "mr", "cq", "pd")
HOST_DEADLINE_S = 10.0     # one agent call (rdma res and kmsg on a TCG guest take ~0.1 s)
# The kernel log is what the oracle judges: its read gets longer. A fresh clone under load 6
# lost host a's log at 10 s (the agent's call queued behind the scenario's last calls on a
# stalled TCG guest), so a WARNING splat went unseen and the scenario passed.
KMSG_DEADLINE_S = 60.0
_DEADLINE_S = {"host_end": KMSG_DEADLINE_S}
MAX_PCAP_BYTES = 8 << 20   # a bulk-data scenario's capture stops growing here
MAX_WIRE_RECORDS = 2000    # frames decoded into `wire` history records at most
MAX_KMSG_RECORDS = kernlog.MAX_RECORDS
def parse_res(out: str, rc: int, err: str, device: str = "",
              kinds: tuple[str, ...] = RES_KINDS) -> dict:
    """{kind: [entries]} from rdma's batch output, one JSON array a command in kinds' order
    (it stops at the first that fails) (only device's entries when given: a netns
    host sees every device); a kind whose command failed or never ran: {"error": ...}."""
    lines = [l for l in out.splitlines() if l.strip()]
    res: dict = {}
    for i, kind in enumerate(kinds):
        if i >= len(lines):
            res[kind] = {"error": f"rdma -j res show {kind}: rc {rc}: "
                                  f"{(err or 'no output').strip()[-300:]}"}
            continue
        try:
            entries = json.loads(lines[i])
        except ValueError:
            res[kind] = {"error": f"rdma -j res show {kind}: not JSON: {lines[i][:300]!r}"}
            continue
        if device and isinstance(entries, list):
            entries = [e for e in entries
                       if not isinstance(e, dict) or e.get("ifname") in (None, device)]
        res[kind] = entries
    return res




# -- host side: runs in the agent ----------------------------------------------------------------

_CAPTURING: dict = {}  # switch control path or bridge -> the Collector whose capture runs there
_RDMA: dict = {}  # the agent's rdma batch process: {"proc", "buf"}
_RDMA_LOCK = threading.Lock()


def rdma_res(device: str = "", deadline_s: float = 5.0,
             kinds: tuple[str, ...] = RES_KINDS) -> dict:
    """`rdma -j res show KIND` for each of kinds, through one rdma process in batch mode
    kept for the agent's life (an exec costs ~0.15 s on a TCG guest; a query then costs its
    netlink dumps). Stops it on any trouble; the next call starts another."""
    with _RDMA_LOCK:
        st = _RDMA
        p = st.get("proc")
        if p is None or p.poll() is not None:
            env = dict(os.environ, PATH=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
            try:
                # stdbuf: each command's JSON line leaves at once, not when a pipe buffer fills.
                p = subprocess.Popen(["stdbuf", "-oL", "rdma", "-j", "-b", "-"], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, close_fds=True)
            except OSError as e:
                return parse_res("", -1, f"rdma batch process: {e}", device, kinds)
            st.update(proc=p, buf=b"")
        lines: list[str] = []
        try:
            p.stdin.write("".join(f"res show {k}\n" for k in kinds).encode())
            p.stdin.flush()
            end = time.monotonic() + deadline_s
            fd = p.stdout.fileno()
            while len(lines) < len(kinds):
                if b"\n" in st["buf"]:
                    line, _, st["buf"] = st["buf"].partition(b"\n")
                    lines.append(line.decode(errors="replace"))
                    continue
                left = end - time.monotonic()
                if left <= 0 or not select.select([fd], [], [], left)[0]:
                    raise TimeoutError(f"rdma answered {len(lines)} of {len(kinds)} "
                                       f"queries within {deadline_s} s")
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise EOFError("rdma exited")
                st["buf"] += chunk
        except (OSError, EOFError, TimeoutError) as e:
            err = _stop_rdma(p)
            return parse_res("\n".join(lines), p.returncode if p.returncode is not None else -1,
                             f"{type(e).__name__}: {e}; {err}", device, kinds)
        return parse_res("\n".join(lines), 0, "", device, kinds)


def _stop_rdma(p) -> str:
    """Ends the batch process; its stderr (why a command failed)."""
    _RDMA.clear()
    p.kill()
    try:
        return (p.communicate(timeout=2)[1] or b"").decode(errors="replace").strip()[-300:]
    except Exception:
        return ""


def host_begin(kmsg: bool = True, device: str = "") -> dict:
    """At a lab's start: the RDMA objects, where the kernel log is, and the clocks."""
    return {"res": rdma_res(device), "kmsg": kernlog.kmsg_mark() if kmsg else None,
            "clock": kernlog.clock_pair()}


def capture_state(path: str, pid: int) -> tuple[bool, int]:
    """(whether pid runs, the size of path): the netns lab's bridge capture seen from a host's
    agent, which shares the outer machine's file system."""
    alive = False
    try:
        with open(f"/proc/{pid}/status") as f:
            alive = not any(l.startswith("State:") and "Z" in l.split()[1:2] for l in f)
    except OSError:
        pass
    return alive, _size(path)


def capture_drained(path: str, pid: int, deadline_s: float = 2.0) -> int:
    """Waits until tcpdump (pid) has written every frame the kernel handed it; the file's size
    then. The kernel wakes tcpdump as it queues a frame (immediate mode), so tcpdump asleep
    (State S: in poll) with the size unchanged around that look means its queue is empty and
    its writes done (-U). A tcpdump gone, or still busy at the deadline, leaves the size as it
    is (the part may miss its last frames)."""
    end = time.monotonic() + deadline_s
    size = _size(path)
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return _size(path)
        now = _size(path)
        if state == "S" and now == size:
            return now
        size = now
        time.sleep(0.005)
    return size


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def file_part(path: str, offset: int, max_bytes: int,
              pid: int = 0) -> tuple[bytes, bytes, int]:
    """(the first 24 bytes, at most max_bytes from offset, the size) of a file: a scenario's
    part of the bridge capture, read once its tcpdump (pid) has written what it was given."""
    if pid:
        capture_drained(path, pid)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        header = f.read(24)
        f.seek(offset)
        return header, f.read(max_bytes), size


def host_res(device: str = "") -> dict:
    """At a scenario's end: the RDMA objects."""
    return rdma_res(device)


def host_end(mark_json: str) -> dict:
    """After the lab's shutdown: the kernel log since the mark host_begin gave (as JSON: a
    dict would go by reference, each of its reads a call back to the controller)."""
    mark = json.loads(mark_json) if mark_json else None
    return {"kmsg": kernlog.kmsg_since(mark, max_records=MAX_KMSG_RECORDS),
            "clock": kernlog.clock_pair()}


# -- controller side -------------------------------------------------------------------------------

def switch_binary() -> pathlib.Path:
    """The fault switch (and frame decoder) the VM lab runs: RDMALAB_SWITCH, else the build's."""
    return pathlib.Path(os.environ.get("RDMALAB_SWITCH",
                                       REPO / "build" / "faults" / "rdmalab-switch"))


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


def kmsg_text(records: list) -> str:
    """Kernel log records as `dmesg -r` prints them (kernlog.from_dmesg reads it back)."""
    return "".join(f"<{lvl}>[{ts // 10**6:5d}.{ts % 10**6:06d}] {text}\n"
                   for _seq, ts, lvl, text in records)


class Collector:
    """One lab's evidence (see the module's doc). registry: rdmalab.findings.registry.Registry whose
    kernel_log entries may expect a splat on a host's driver and kernel."""

    def __init__(self, lab, directory, *, scenario: str, column: str, registry=None,
                 log: Callable[[str], None] = lambda m: None):
        self.lab, self.dir = lab, pathlib.Path(directory)
        self.scenario, self.column, self.registry, self.log = scenario, column, registry, log
        self.hosts = list(lab.addresses)
        self.files: dict[str, str] = {}
        self.errors: list[str] = []
        self.caps: dict[str, str] = {}
        self.splats: list[dict] = []
        self._marks: dict[str, dict] = {}
        self._clock: Optional[tuple[int, int, int]] = None  # (realtime, monotonic, offset)
        self._capture = None      # ("switch", SwitchControl) or ("bridge", netns.BridgeCapture)
        self._capture_key = ""
        self._bridge_offset = 0
        self._cost_s = 0.0
        machines = [lab.machine_of(h) for h in self.hosts]
        outers = {id(getattr(m, "outer", m)) for m in machines}
        # The netns lab's hosts are namespaces on one kernel: its log is read once.
        self.shared_kernel = len(machines) > 1 and len(outers) == 1 and hasattr(
            machines[0], "outer")

    # -- helpers
    def _device(self, host: str) -> str:
        return self.lab.machine_of(host).facts.device

    def _parallel(self, tasks: list[tuple[str, str, Callable[[], object]]]) -> dict:
        """(host, what, fn) each in a thread of its own, at once: {(host, what): result}. A
        host that is lost, or fails or does not answer by its deadline, is left out with an
        error noted: an outcome of the scenario, never a hang."""
        results: dict = {}
        lost = self.lab.lost_hosts()

        def one(host: str, what: str, fn) -> None:
            if host in lost:
                self.errors.append(f"{host}: {what}: the host was lost")
                return
            try:
                results[(host, what)] = fn()
            except Exception as e:  # a lost or broken host: kept in the manifest
                self.errors.append(f"{host}: {what}: {type(e).__name__}: {e}")

        threads = [threading.Thread(target=one, args=t, daemon=True) for t in tasks]
        for t in threads:
            t.start()
        wait_s = KMSG_DEADLINE_S if any(w == "kernel log" for _, w, _ in tasks) \
            else HOST_DEADLINE_S
        end = time.monotonic() + wait_s + 5.0
        for t in threads:
            t.join(max(0.0, end - time.monotonic()))
        for (host, what, _), t in zip(tasks, threads):
            if t.is_alive():
                self.errors.append(f"{host}: {what}: no answer within {wait_s} s")
        return dict(results)

    def _agent_call(self, host: str, fn: str, *args) -> Callable[[], object]:
        def call():
            agent = self.lab.agent_for(host)
            broken_before = agent.broken
            try:
                return agent.call_copy("rdmalab.report.evidence", fn, *args, what=f"evidence {fn}",
                                       deadline_s=_DEADLINE_S.get(fn, HOST_DEADLINE_S))
            except Hung:
                if not broken_before:  # stuck in this call, not refused as broken already
                    self.lab.record_stuck(host, agent)
                raise
        return call


    def _write(self, name: str, text: str, what: str) -> None:
        (self.dir / name).write_text(text, encoding="utf-8")
        self.files[name] = what

    def _json(self, name: str, value, what: str) -> None:
        self._write(name, json.dumps(value, indent=1, sort_keys=True) + "\n", what)

    # -- the three points of a scenario
    def begin(self) -> None:
        """At the lab's start: kernel-log marks, `rdma res` before, the capture started."""
        t = time.monotonic()
        self.dir.mkdir(parents=True, exist_ok=True)
        kmsg_hosts = self.hosts[:1] if self.shared_kernel else self.hosts
        got = self._parallel([(h, "begin", self._agent_call(h, "host_begin", h in kmsg_hosts,
                                                            self._device(h)))
                              for h in self.hosts])
        for host in self.hosts:
            r = got.get((host, "begin"))
            if r is None:
                continue
            self._json(f"res-{host}-before.json", r["res"],
                       f"`rdma -j res show` ({', '.join(RES_KINDS)}) on {host} at the "
                       "lab's start")
            if r.get("kmsg") is not None:
                self._marks[host] = r["kmsg"]
            if self._clock is None:
                rt, mono = r["clock"]
                self._clock = (rt, mono, self.lab.agent_for(host).offset_ns)
        try:
            self._start_capture()
        except Exception as e:  # the scenario runs all the same; the bundle says why
            self.errors.append(f"capture: {type(e).__name__}: {e}")
        self._cost_s += time.monotonic() - t

    def scenario_end(self) -> None:
        """Before the lab shuts down: `rdma res` after (the objects the scenario left)."""
        t = time.monotonic()
        got = self._parallel([(h, "rdma res", self._agent_call(h, "host_res", self._device(h)))
                              for h in self.hosts])
        for (host, _), res in sorted(got.items()):
            self._json(f"res-{host}-after.json", res,
                       f"`rdma -j res show` ({', '.join(RES_KINDS)}) on {host} at the "
                       "scenario's end, before the lab's shutdown")
        self._cost_s += time.monotonic() - t

    def finish(self) -> list[dict]:
        """After the lab's shutdown: the capture stopped and decoded into `wire` records, each
        host's kernel log read and its splats judged (`kernel_log` records), the switch's
        records; the manifest. Returns the splats ({host, kind, first_line, file,
        expected_by})."""
        t = time.monotonic()
        records: list[dict] = []
        try:
            records += self._stop_capture()
        except Exception as e:
            self.errors.append(f"capture: {type(e).__name__}: {e}")
        records += self._kernel_logs()
        self.lab.merge_records(records)
        switch = self.lab.faults.switch_history() if hasattr(self.lab.faults,
                                                             "switch_history") else []
        if switch:
            self._write("switch.jsonl", "".join(json.dumps(r, sort_keys=True) + "\n"
                                                for r in switch),
                        "the fault switch's rule records (switch_* in the history)")
        self._cost_s += time.monotonic() - t
        self.write_manifest()
        return self.splats

    def write_history(self, source: Optional[str] = None) -> None:
        """history.jsonl: a copy of the file the run wrote (source), else the lab's own."""
        dest = self.dir / "history.jsonl"
        if source and os.path.exists(source):
            shutil.copyfile(source, dest)
        else:
            self.lab.write_history(dest)
        self.files["history.jsonl"] = "the scenario's history (with wire and kernel_log)"
        self.write_manifest()

    # -- the wire
    def _start_capture(self) -> None:
        path = self.lab.switch_unusable()
        m = self.lab.machine_of(self.hosts[0])
        bridge = getattr(m, "bridge", None)
        key = path if not path.startswith("!") else f"{getattr(m, 'outer', m).name}:{bridge}"
        other = _CAPTURING.get(key)
        if other is not None:  # a test's second lab on the same wire: one capture at a time
            self.caps["wire"] = (f"no capture of its own: the wire's capture is in "
                                 f"{other.dir.name}'s bundle")
            return
        self._capture_key = key
        if not path.startswith("!"):
            from ..faults.fabric import SwitchControl
            control = SwitchControl(path)
            control.request("pcap", path=str((self.dir / "wire.pcap").resolve()),
                            max_bytes=MAX_PCAP_BYTES)
            self._capture = ("switch", control)
            _CAPTURING[key] = self
            return
        if getattr(m, "bridge_machine", None) is not None and bridge:
            from ..machines import netns
            cap = netns.BridgeCapture.shared(m.bridge_machine, bridge,
                                             max_bytes=MAX_PCAP_BYTES)
            reader = self.hosts[0]
            self._bridge_offset = cap.mark(probe=lambda path, pid: self._agent_call(
                reader, "capture_state", path, pid)())
            self._capture = ("bridge", cap)
            _CAPTURING[key] = self
            return
        self.caps["wire"] = "no capture: no fault switch or bridge on the hosts' path"

    def _stop_capture(self) -> list[dict]:
        if self._capture is None:
            return []
        where, cap = self._capture
        self._capture = None
        _CAPTURING.pop(self._capture_key, None)
        pcap = self.dir / "wire.pcap"
        if where == "switch":
            try:
                closed = cap.request("pcap", path=None).get("closed") or {}
            finally:
                cap.close()
            if closed.get("skipped"):
                self.caps["pcap"] = (f"capped at {MAX_PCAP_BYTES} bytes: {closed['frames']} "
                                     f"frames kept, {closed['skipped']} later ones not")
            offset = time.time_ns() - time.monotonic_ns()  # the switch runs here

            def to_lab(t_ns: int) -> int:
                return t_ns - offset - self.lab.t0_ns
            what = "the fault switch's capture (every frame it received) for the scenario"
        else:
            reader = next((h for h in self.hosts if h not in self.lab.lost_hosts()), None)
            read = None if reader is None else (lambda path, off, n, pid: self._agent_call(
                reader, "file_part", path, off, n, pid)())
            stats = cap.take(self._bridge_offset, str(pcap), read=read)
            if stats.get("capped"):
                self.caps["pcap"] = f"capped at {stats['capped']}"
            if self._clock is None:
                raise RuntimeError("no clock of the bridge's machine: no host answered")
            rt, mono, off = self._clock

            def to_lab(t_ns: int) -> int:
                return t_ns - (rt - mono) + off - self.lab.t0_ns
            what = f"tcpdump on the bridge {cap.bridge} in {cap.machine.name} for the scenario"
        if not pcap.exists():
            raise RuntimeError(f"{pcap.name}: the capture wrote no file")
        self.files["wire.pcap"] = what
        frames, end = decode_pcap(pcap)
        if end.get("frames", 0) > end.get("decoded", 0):
            self.caps["wire"] = (f"{end['decoded']} of {end['frames']} frames decoded into "
                                 f"wire records (MAX_WIRE_RECORDS)")
        macs = {h: self.lab.machine_of(h).facts.mac for h in self.hosts}
        return wire_records(frames, macs, where, to_lab)

    # -- the kernels
    def _kernel_logs(self) -> list[dict]:
        if self.shared_kernel:
            reader = next((h for h in self.hosts if h in self._marks), None)
            readers = [reader] if reader else []
        else:
            readers = [h for h in self.hosts if h in self._marks]
        for h in self.hosts:
            if h not in self._marks and not self.shared_kernel:
                self.errors.append(f"{h}: no kernel-log mark at the start: its log is not "
                                   "judged")
        got = self._parallel([(h, "kernel log", self._agent_call(h, "host_end",
                                                              json.dumps(self._marks[h])))
                              for h in readers])
        records: list[dict] = []
        for (reader, _), r in sorted(got.items()):
            k = r["kmsg"]
            if k.get("error"):
                self.errors.append(f"{reader}: kernel log: {k['error']}")
            if k.get("truncated"):
                self.caps[f"kmsg-{reader}"] = (f"kernel log capped at {MAX_KMSG_RECORDS} "
                                               "records (or its read deadline)")
            if k.get("lost"):
                self.caps[f"kmsg-{reader}-lost"] = (f"{k['lost']} records overwritten before "
                                                    "they were read")
            lines = [kernlog.Line(*rec) for rec in k["records"]]
            owners = self.hosts if self.shared_kernel else [reader]
            text = kmsg_text(k["records"])
            offset = self.lab.agent_for(reader).offset_ns
            for host in owners:
                self._write(f"kmsg-{host}.txt", text,
                            f"{host}'s kernel log since the lab started, through its shutdown"
                            + (" (one kernel: every host of the netns lab)"
                               if self.shared_kernel else "")
                            + (" (the host rebooted: all of its new boot)"
                               if k.get("rebooted") else ""))
            for n, splat in enumerate(kernlog.find_splats(lines), 1):
                records += self._judge(splat, n, owners, offset)
        return records

    def _judge(self, splat, n: int, owners: list[str], offset_ns: int) -> list[dict]:
        records = []
        for host in owners:
            name = f"splat-{host}-{n}.txt"
            self._write(name, splat.dmesg(), f"kernel {splat.kind} splat on {host}: "
                                             f"{splat.first_line}")
            m = self.lab.machine_of(host)
            from ..labs.agent import device_label
            key = device_label(m.facts.device)
            kernel = self.lab.pool.kernels.get(m.name, "")
            expected = (self.registry.expected_splat(key, kernel, splat.text)
                        if self.registry is not None else None)
            self.splats.append({"host": host, "kind": splat.kind,
                                "first_line": splat.first_line, "file": name,
                                "lines": len(splat.lines), "ended": splat.ended,
                                "kernel": kernel,
                                "expected_by": expected.id if expected else None})
            for line in splat.lines:
                records.append({"t_ns": line.ts_us * 1000 + offset_ns - self.lab.t0_ns,
                                "host": host, "object": "kmsg", "kind": "kernel_log",
                                "data": {"level": line.level_name, "text": line.text,
                                         "splat": True, "seq": line.seq,
                                         "splat_kind": splat.kind, "file": name,
                                         **({"expected_by": expected.id} if expected
                                            else {})}})
        return records

    def write_manifest(self) -> None:
        kernels = {h: self.lab.pool.kernels.get(self.lab.machine_of(h).name, "")
                   for h in self.hosts}
        manifest = {"scenario": self.scenario, "column": self.column, "lab":
                    self.lab.description, "kernel": kernels, "shared_kernel": self.shared_kernel,
                    "files": dict(sorted(self.files.items())), "splats": self.splats,
                    "capped": self.caps, "errors": self.errors,
                    "cost_s": round(self._cost_s, 3)}
        (self.dir / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n",
                                                encoding="utf-8")
