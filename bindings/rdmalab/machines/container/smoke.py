"""Smoke test of the container hosts, no RDMA needed: run from the repository root, as root,
after `bindings/rdmalab/machines/container/hosts.sh start N PREFIX`:

    /usr/bin/python3 -m rdmalab.machines.container.smoke [N] [PREFIX]

For each host: commands and the network (its address, a ping to every peer over the bridge),
the host lock (rdmalab.machines.hostcheck.HostLock: `podman exec -i`, held while stdin is open), the agent
shipped by rdmalab.machines.deploy.ensure_agent (podman cp), started over execnet
(`popen//python=podman exec -i <name> /usr/bin/python3`) with rdmalab.machines.deploy.open_agent_channel and
driven over RPyC (rdmalab.agent.remote.Agent): its hostname, where rdmalab and the engine were
imported from. Where the kernel has RDMA (Linux >= 7.1 with hosts.sh's RLC_RXE=1) it also
lists the host's device from inside the agent. Exit 0: everything worked.
"""
from __future__ import annotations

import argparse
import sys
import time

import execnet

from .. import deploy
from .machine import container_hosts
from ..hostcheck import HostLock
from ...agent.remote import Agent
from ...paths import REPO


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m rdmalab.machines.container.smoke",
                                 description="smoke test of the container hosts hosts.sh started")
    ap.add_argument("n", nargs="?", type=int, default=2, help="how many hosts (default 2)")
    ap.add_argument("prefix", nargs="?", default="rlc", help="their name prefix (default rlc)")
    args = ap.parse_args(argv[1:])
    machines = container_hosts(args.n, args.prefix)
    for m in machines:
        t0 = time.monotonic()
        m.wait_ready(30)
        addr = m.run("ip -br -4 addr show eth0", 30).check("address").out.split()
        print(f"{m.name}: ready in {time.monotonic() - t0:.2f} s; eth0 {' '.join(addr[1:])}")
        for peer in machines:
            if peer is not m:
                r = m.run(f"ping -c 1 -W 2 {peer.facts.data_address}", 30)
                print(f"  ping {peer.name} ({peer.facts.data_address}): "
                      f"{'ok' if r.rc == 0 else 'FAILED: ' + (r.out + r.err)[-300:]}")
                if r.rc != 0:
                    return 1

        with HostLock(m).acquire(10) as lock:  # noqa: F841  (popen with stdin held open)
            print(f"  host lock {lock.path}: held")

        t0 = time.monotonic()
        inst = deploy.ensure_agent(m, REPO, log=lambda s: print("  " + s))
        print(f"  agent {inst.version} at {inst.path} (copied {inst.copied}, "
              f"built on host {inst.built_on_host}) in {time.monotonic() - t0:.2f} s")

        t0 = time.monotonic()
        gw = execnet.makegateway(m.execnet_spec())
        channel = deploy.open_agent_channel(gw, inst.path, inst.version, m.name)
        agent = Agent.start(gw, m.name, channel=channel)
        try:
            hostname = agent.module("socket").gethostname()
            rdmalab_file = agent.module("rdmalab").__file__
            core_file = agent.module("rdmalab._core").__file__
            print(f"  agent over '{m.execnet_spec()}' up in {time.monotonic() - t0:.2f} s: "
                  f"hostname {hostname}; rdmalab from {rdmalab_file}; engine {core_file}")
            if hostname != m.name:
                print(f"  FAILED: the agent runs on {hostname}, not {m.name}")
                return 1
            devs = agent.module("os").listdir("/sys/class/infiniband") \
                if agent.module("os.path").isdir("/sys/class/infiniband") else []
            print(f"  RDMA devices the host sees: {list(devs) or 'none (no RDMA in this kernel)'}")
        finally:
            agent.close()
    print("smoke: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
