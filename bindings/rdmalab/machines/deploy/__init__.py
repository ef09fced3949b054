"""The agent shipped to each host: the controller's own rdmalab package and engine.

A host runs the agent (rdmalab.agent.serve) from `<agent_dir>/<version>/`, where version is a
hash of the package's Python files and of the engine's sources. The controller installs it
there when the host has none, or another version:

    installed = ensure_agent(machine, repo)          # one round trip when already there
    channel = open_agent_channel(gateway, installed.path, installed.version, machine.name)
    # ... rpyc.connect_stream(ExecnetStream(channel), ...) as rdmalab.agent.remote does

The controller's built engine (rdmalab/_core*.so, debug info stripped) is tried first; where it
does not load on the host (another Python, another libstdc++ or rdma-core soname) the engine is
built there from the shipped source, against the host's own libibverbs and librdmacm.

The rooms: common (the error, how a command runs on a host), shipment (the bundle: what the
controller ships), hostcode (the code that runs on a host, as text: the fit check, the agent's
boot), hostbuild (the engine built on a host), install (ensure_agent).
"""
from __future__ import annotations

from .common import AGENT_DIR, PYTHON, DeployError
from .hostbuild import BUILD_OPTIONS, REQUIREMENTS
from .hostcode import INSTALLED, check_version, open_agent_channel, remote_boot_snippet
from .install import Installed, ensure_agent
from .shipment import PACKAGE, Bundle, bundle

__all__ = [
    "AGENT_DIR", "BUILD_OPTIONS", "Bundle", "DeployError", "INSTALLED", "Installed", "PACKAGE",
    "PYTHON", "REQUIREMENTS", "bundle", "check_version", "ensure_agent", "open_agent_channel",
    "remote_boot_snippet",
]
