"""The run options, declared once: each row is an option of the pytest plugin
(rdmalab.run.pytest_plugin), of `python3 -m rdmalab run` (rdmalab.run.cli), or of both, with its
type, default and help, and how `run` takes it and forwards it to pytest. The plugin adds the
rows it declares to its option group; `run` adds its rows to its parser and passes each value
given (a repeatable one once per value) to pytest under the plugin's name (the metrics options
too: rdmalab.run.metrics_pytest reads them). --out is turned into pytest's --history-dir and
--junitxml by `run` itself.

It imports nothing: the CLI reads it without the engine or pytest."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

_SAME = object()  # the `run` command's default is the plugin's
TIMEOUT_S = 300.0  # the plugin's wall-clock net per test
KERNEL_HELP = ("the VM lab's guest kernel: bookworm (default), trixie, sid, or a Debian release "
               "such as 6.12.117+deb13-amd64")


@dataclasses.dataclass(frozen=True)
class Run:
    """How `python3 -m rdmalab run` takes an option."""
    flag: Optional[str] = None  # its own name for it, when not the plugin's
    help: Optional[str] = None  # its own help, where it says more or less
    default: Any = _SAME        # its own default; None: forwarded only when given
    forward: bool = True        # False: `run` turns it into pytest's arguments itself


@dataclasses.dataclass(frozen=True)
class RunOption:
    flag: str                  # the plugin's name for it (pytest's own for -k)
    help: str
    type: Optional[Callable[[str], Any]] = None  # parses the text (int, float)
    default: Any = None
    metavar: Optional[str] = None
    repeat: bool = False       # each use adds one value
    dest: Optional[str] = None
    plugin: bool = True        # the plugin declares it (False: pytest or metrics_pytest does)
    run: Optional[Run] = None  # None: the plugin's only

    def run_dest(self) -> str:
        """The attribute `run`'s parser keeps the value in."""
        return self.dest or (self.run.flag or self.flag).lstrip("-").replace("-", "_")

    def arguments(self, help: str, default: Any) -> dict:
        """The keyword arguments of argparse's add_argument (pytest's addoption takes them)."""
        kwargs: dict = {"default": default, "help": help}
        if self.repeat:
            kwargs["action"] = "append"
        for key in ("type", "metavar", "dest"):
            if getattr(self, key) is not None:
                kwargs[key] = getattr(self, key)
        return kwargs


RUN_OPTIONS = (
    RunOption("--lab", repeat=True,
              help='labs to run on, repeatable: "model" (every personality), "model:ib,roce", '
                   '"vm" or "vm:rxe,siw" (the soft-RoCE VM lab), "netns:rxe" (hosts as network '
                   'namespaces on one kernel), "inventory:PATH" (the machines of a TOML '
                   'inventory)',
              run=Run(help='repeatable: "model", "model:ib,roce", "vm", "vm:rxe,siw", '
                           '"netns:rxe" (hosts as network namespaces), "inventory:PATH" '
                           '(default model). A VM lab that cannot run here falls back to the '
                           'model, saying why')),
    RunOption("--vm-hosts", type=int, default=2, help="hosts (VMs) in the VM lab (default 2)",
              run=Run(help="hosts of the VM or netns lab (default 2)")),
    RunOption("--kernel", metavar="SUITE|RELEASE", help=KERNEL_HELP + " (also RDMALAB_VM_KERNEL)",
              run=Run(help=KERNEL_HELP)),
    RunOption("--seed", type=int, default=1, help="seed of every lab (default 1)", run=Run()),
    RunOption("--history-dir",
              help="write one JSON-lines history per lab into this directory"),
    RunOption("--evidence-dir",
              help="an evidence bundle per scenario on device labs (capture, rdma res, kernel "
                   "logs and their splats) in this directory; default: `evidence` beside "
                   "--history-dir when that is given"),
    RunOption("--out", default="out", help="output directory (default out/)", plugin=False,
              run=Run(forward=False)),
    RunOption("-k", dest="keyword", help="pytest -k expression", plugin=False, run=Run()),
    RunOption("--rdmalab-timeout", type=float, default=TIMEOUT_S,
              help="wall-clock seconds per test before it fails (0 = no limit)",
              run=Run("--timeout", f"wall-clock seconds per test (plugin default {TIMEOUT_S:g})",
                      default=None)),
    RunOption("--findings-registry",
              help="the findings registry the @finding markers name (default: the package's "
                   "findings.toml)"),
    RunOption("--metrics-listen", metavar="HOST:PORT",
              help="serve Prometheus metrics at http://HOST:PORT/metrics (loopback if only "
                   ":PORT; port 0 picks one)",
              run=Run(help="serve Prometheus metrics while the run lasts (off by default)")),
    RunOption("--metrics-push", metavar="URL",
              help="push the metrics to this Pushgateway (http://host:port) at the end",
              run=Run(help="push the metrics to this Pushgateway at the end (off by default)")),
    # None: rdmalab.run.metrics' own (DEFAULT_JOB, SYSFS_ROOT), read where they are used
    RunOption("--metrics-job", help="Pushgateway job name (default rdmalab_batch)"),
    RunOption("--metrics-sysfs", metavar="DIR",
              help="device counters root (default /sys/class/infiniband)"),
    RunOption("--metrics-linger", type=float, default=0.0, metavar="S",
              help="keep serving S seconds after the session (a last scrape)"),
)


def add_to_pytest(group) -> None:
    """The plugin's options, into its pytest option group."""
    for o in RUN_OPTIONS:
        if o.plugin:
            group.addoption(o.flag, **o.arguments(o.help, o.default))


def add_to_run(parser) -> None:
    """`run`'s options, into its argparse parser."""
    for o in RUN_OPTIONS:
        if o.run is None:
            continue
        default = o.default if o.run.default is _SAME else o.run.default
        parser.add_argument(o.run.flag or o.flag, **o.arguments(o.run.help or o.help, default))


def forwarded(args) -> list[str]:
    """The pytest arguments of the values `run` was given: each under the plugin's name."""
    argv: list[str] = []
    for o in RUN_OPTIONS:
        if o.run is None or not o.run.forward:
            continue
        value = getattr(args, o.run_dest())
        if value is None:
            continue
        for v in value if o.repeat else [value]:
            argv += [o.flag, str(v)]
    return argv
