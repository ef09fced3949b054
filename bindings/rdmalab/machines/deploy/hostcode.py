"""The code that runs on a host, as text, and what its answers mean: the fit check (does the
deployed package load with the host's Python, engine included?) and the agent's boot (started
through execnet, it says its version before RPyC's bytes follow). Each is run by another
interpreter: its imports are that interpreter's."""
from __future__ import annotations

from ..machine import Machine
from .common import PYTHON, DeployError

UNPACK_FAILED = 20
PREPARE_FAILED = 21
INSTALLED = "RDMALAB-AGENT-INSTALLED"  # the probe's word for "there, and it loads"
# Does the deployed package load with this interpreter? Exit 0: yes; 3: the engine does not fit
# (absent for this Python, or its ImportError: bad ELF, undefined symbol, missing soname);
# 5: a runtime dependency of the agent is missing; anything else: the package itself is broken.
FIT_CHECK = r"""
import os, sys, sysconfig
d = sys.argv[1]
so = os.path.join(d, "rdmalab", "_core" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
if not os.path.exists(so):
    print("no engine for this Python (%s, %s)" % (sys.version.split()[0], os.path.basename(so)))
    sys.exit(3)
sys.path.insert(0, d)
try:
    import rdmalab
    import rdmalab._core  # the package's face loads the engine lazily: load it here
except ImportError as e:
    if e.path == so or e.name == "rdmalab._core":
        print("engine does not load: %s" % e)
        sys.exit(3)
    raise
if not rdmalab.__file__.startswith(d + os.sep):
    sys.exit("rdmalab was imported from %s, not %s" % (rdmalab.__file__, d))
try:
    import rpyc  # the agent's protocol over the execnet channel
except ImportError:
    print("python3-rpyc: the agent serves the controller over RPyC")
    sys.exit(5)
"""


def fit_failure(machine: Machine, r, v: str, after_build: bool) -> None:
    """Raises unless the check said only "the engine does not fit" (rc 3) before a build."""
    text = (r.out + r.err).strip()[-1500:]
    if r.rc == 3 and not after_build:
        return
    if r.timed_out:
        raise DeployError(f"{machine.name}: unpacking or loading the agent at {v} timed out")
    if r.rc == UNPACK_FAILED:
        raise DeployError(f"{machine.name}: unpacking the agent into {v} failed "
                          f"(disk full? tar missing?): {text}")
    if r.rc == 3:
        raise DeployError(f"{machine.name}: the engine built on the host does not load: {text}")
    if r.rc == 5:
        raise DeployError(f"{machine.name}: the agent needs {text.splitlines()[-1]}; "
                          f"install it there: apt-get install python3-rpyc")
    raise DeployError(f"{machine.name}: the rdmalab package at {v} does not import with "
                      f"the host's {PYTHON} (rc {r.rc}):\n{text}")


def check_version(remote_version: str, expected: str, host: str) -> None:
    """DeployError unless the host's agent is the controller's version."""
    if remote_version != expected:
        raise DeployError(
            f"host {host} runs rdmalab agent {remote_version or '(none)'}, the controller is "
            f"{expected}: redeploy with rdmalab.machines.deploy.ensure_agent(machine, repo) "
            f"(it installs {expected} beside the other) and start the agent from its path")


# execnet's remote_exec body (`channel` in scope). Its first message is a hello the controller
# checks ({"version", "error"}); RPyC's bytes follow only when it is right.
BOOT = r"""
def _rdmalab_boot(channel, path, expected):
    import os, socket, sys
    here = socket.gethostname()
    try:
        with open(os.path.join(path, "rdmalab", "DEPLOYED_VERSION")) as f:
            found = f.read().strip()
    except OSError as e:
        channel.send({"version": "", "error": "%s: no rdmalab agent deployed at %s (%s)"
                      % (here, path, e)})
        return
    if found != expected:
        channel.send({"version": found, "error": "%s runs rdmalab agent %s, the controller is "
                      "%s: redeploy" % (here, found, expected)})
        return
    sys.path.insert(0, path)
    import rdmalab
    if not rdmalab.__file__.startswith(path + os.sep):
        channel.send({"version": found, "error": "%s: rdmalab was imported from %s before the "
                      "agent at %s" % (here, rdmalab.__file__, path)})
        return
    from rdmalab.agent.serve import serve
    channel.send({"version": found, "error": ""})
    serve(channel)
_rdmalab_boot(channel, __PATH__, __VERSION__)
"""


def remote_boot_snippet(path: str, version: str) -> str:
    """The source to remote_exec on a host's gateway: starts the agent deployed at path if it
    is `version`, else sends why not."""
    return BOOT.replace("__PATH__", repr(path)).replace("__VERSION__", repr(version))


def open_agent_channel(gateway, path: str, version: str, host: str, timeout: float = 120.0):
    """Starts the agent at path on the gateway's host and checks its version: the channel,
    ready for RPyC (rdmalab.agent.remote.ExecnetStream). DeployError on a mismatch or a failed
    start."""
    import execnet  # optional: only a controller that starts agents needs it
    channel = gateway.remote_exec(remote_boot_snippet(path, version))
    try:
        hello = channel.receive(timeout)
    except channel.TimeoutError:
        raise DeployError(f"{host}: the rdmalab agent at {path} did not start within "
                          f"{timeout:.0f} s") from None
    except (EOFError, execnet.RemoteError, OSError) as e:
        raise DeployError(f"{host}: the rdmalab agent at {path} failed to start: {e}") from e
    if not isinstance(hello, dict):
        raise DeployError(f"{host}: the agent at {path} did not say its version ({hello!r:.80})")
    found, error = hello.get("version", ""), hello.get("error", "")
    if not found and error:  # nothing deployed there (or unreadable): say what was tried
        raise DeployError(f"host {host}: {error}: deploy it with "
                          f"rdmalab.machines.deploy.ensure_agent(machine, repo)")
    check_version(found, version, host)
    if error:
        raise DeployError(f"host {host}: {error}")
    return channel
