"""Shipping the agent (rdmalab.machines.deploy) to a host, played by this machine (rdmalab.machines.localmachine): the
install, the no-op second time, a fresh interpreter that sees only the deployed copy, the
build-on-host path (its dependency check, and one real build), and the version check when the
agent starts over execnet."""

import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

from rdmalab.machines import deploy
from rdmalab.machines.deploy import DeployError, bundle, ensure_agent, shipment
from rdmalab.machines.localmachine import LocalMachine
from rdmalab.machines.machine import Fleet

ENGINE = REPO / "bindings" / "rdmalab" / f"_core{shipment._ext_suffix()}"
pytestmark = pytest.mark.skipif(not ENGINE.exists(), reason="the engine is not built (make build)")


class CountingMachine(LocalMachine):
    """A LocalMachine that counts round trips and copies."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.runs: list[str] = []
        self.copies: list[str] = []

    def run(self, cmd, timeout=60.0, *, root=False):
        self.runs.append(cmd)
        return super().run(cmd, timeout, root=root)

    def copy_to(self, local, remote, timeout=300.0):
        self.copies.append(remote)
        super().copy_to(local, remote, timeout)


def make_repo(dest: Path, engine: bytes | None) -> Path:
    """A copy of what the bundle reads from the checkout, with `engine` as the built module."""
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.pyc")
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(REPO / "CMakeLists.txt", dest / "CMakeLists.txt")
    for f in shipment._engine_includes(REPO):  # cmake/unity.cmake
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, dest / f)
    for d in shipment._engine_dirs(REPO):  # core, faults, bench, bindings: what CMake adds
        shutil.copytree(REPO / d, dest / d, ignore=ignore)
    if engine is not None:
        (dest / "bindings" / "rdmalab" / ENGINE.name).write_bytes(engine)
    return dest


@pytest.fixture(scope="module")
def unfit_repo(tmp_path_factory) -> Path:
    """A checkout whose engine does not load anywhere: what a host with another Python or
    libstdc++ sees."""
    return make_repo(tmp_path_factory.mktemp("repo"), b"\x7fELF not really an engine\n")


def fresh_python(code: str, path: str) -> subprocess.CompletedProcess:
    """/usr/bin/python3 with only `path` added: no PYTHONPATH, not the checkout's bindings."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(["/usr/bin/python3", "-I", "-c",
                           f"import sys; sys.path.insert(0, {path!r})\n" + code],
                          capture_output=True, text=True, env=env, cwd="/", timeout=120)


def test_bundle_version_is_over_sources_not_the_built_engine(unfit_repo, tmp_path):
    b = bundle(REPO)
    assert len(b.version) == 16 and int(b.version, 16) >= 0
    assert "CMakeLists.txt" in b.sources and "core/CMakeLists.txt" in b.sources
    assert "bindings/src/module.cc" in b.sources and "bindings/CMakeLists.txt" in b.sources
    assert "cmake/unity.cmake" in b.sources  # what CMakeLists.txt includes
    assert not any(s.startswith("bindings/rdmalab") for s in b.sources)
    assert "bindings/rdmalab/agent/serve.py" in b.package
    assert "bindings/rdmalab/findings/findings.toml" in b.package  # the package's data ships with it
    assert b.platform == shipment._ext_suffix().strip(".").removesuffix(".so")
    # Another engine from the same sources: the same version (a host that rebuilt it matches).
    other = bundle(unfit_repo)
    assert other.version == b.version and other.engine_sha256 != b.engine_sha256
    # A changed source: another version.
    changed = make_repo(tmp_path / "changed", b"x")
    with open(changed / "core" / "CMakeLists.txt", "a") as f:
        f.write("# changed\n")
    assert bundle(changed).version != b.version


def test_bundle_ships_a_stripped_engine_and_a_manifest(tmp_path):
    b = bundle(REPO)
    tar_path = b.write(tmp_path)
    with tarfile.open(tar_path) as tar:
        names = set(tar.getnames())
        so = tar.getmember(f"rdmalab/{ENGINE.name}")
        manifest = json.load(tar.extractfile("manifest.json"))
        version = tar.extractfile("rdmalab/DEPLOYED_VERSION").read().decode().strip()
        with tarfile.open(fileobj=tar.extractfile("src.tar.gz")) as src:
            sources = set(src.getnames())
    assert {"rdmalab/__init__.py", "rdmalab/agent/serve.py", "rdmalab/findings/findings.toml",
            "src.tar.gz"} <= names
    assert so.size <= ENGINE.stat().st_size
    assert manifest["version"] == version == b.version
    assert manifest["engine_sha256"] == b.engine_sha256 and manifest["platform"] == b.platform
    assert sources == set(b.sources)


def test_bundle_without_an_engine_says_build_it_first(tmp_path):
    with pytest.raises(DeployError, match="build it first: make build"):
        bundle(make_repo(tmp_path, engine=None))


def test_ensure_agent_installs_once_then_is_one_round_trip(tmp_path):
    m = CountingMachine("h1")
    logs: list[str] = []
    first = ensure_agent(m, REPO, agent_dir=str(tmp_path), log=logs.append)
    assert first.copied and not first.built_on_host
    assert first.path == f"{tmp_path}/{first.version}" and len(m.copies) == 1
    assert (Path(first.path) / "READY").exists()
    assert not (tmp_path / f"{first.version}.tmp").exists()
    assert any("copied" in line for line in logs)

    m.runs.clear()
    m.copies.clear()
    second = ensure_agent(m, REPO, agent_dir=str(tmp_path), log=logs.append)
    assert second == deploy.Installed(first.path, first.version, False, copied=False)
    assert len(m.runs) == 1 and m.copies == []

    # Only the deployed copy, never the checkout: the engine loads and a model lab runs.
    r = fresh_python(
        "import rdmalab, rdmalab._core, rdmalab.labs.engine\n"
        f"assert not any(p.startswith({str(REPO / 'bindings')!r}) for p in sys.path)\n"
        "assert rdmalab.__file__.startswith(sys.path[0]), rdmalab.__file__\n"
        "lab = rdmalab.labs.engine.model_lab(seed=1)\n"
        "lab.shutdown()\n"
        "print('model lab ok', open(sys.path[0] + '/rdmalab/DEPLOYED_VERSION').read())",
        first.path)
    assert r.returncode == 0, r.stderr
    assert f"model lab ok {first.version}" in r.stdout


def test_a_version_that_loaded_there_before_is_copied_in_two_round_trips(unfit_repo, tmp_path):
    """After a reboot emptied the host's agent_dir, the pool ships again the version an agent
    ran from before (loaded_before): the probe that finds nothing makes the directory, and the
    copy is checked for its files, not imported (each import of the engine takes seconds on a
    TCG guest; the agent's own start imports it)."""
    m = CountingMachine("h9")
    version = bundle(unfit_repo).version  # its engine loads nowhere: an import would fail
    got = ensure_agent(m, unfit_repo, agent_dir=str(tmp_path), log=lambda s: None,
                       loaded_before=version)
    assert got == deploy.Installed(f"{tmp_path}/{version}", version, False, copied=True)
    assert len(m.runs) == 2 and len(m.copies) == 1, m.runs
    assert (tmp_path / version / "READY").exists()


def test_a_kept_install_of_a_version_that_loaded_there_before_is_not_imported(unfit_repo,
                                                                             tmp_path):
    """After a reboot that kept agent_dir (a real machine's /var/tmp; a vmlab guest's kept
    folder), the install of a version an agent ran from before is found by its files in one
    round trip, not imported again (an import costs a TCG guest seconds; the agent's start
    imports it): unfit_repo's engine loads nowhere, so an import would have failed."""
    m = CountingMachine("h9")
    version = bundle(unfit_repo).version
    first = ensure_agent(m, unfit_repo, agent_dir=str(tmp_path), log=lambda s: None,
                         loaded_before=version)
    m.runs.clear()
    m.copies.clear()
    again = ensure_agent(m, unfit_repo, agent_dir=str(tmp_path), log=lambda s: None,
                         loaded_before=version)
    assert again == deploy.Installed(first.path, version, False, copied=False)
    assert len(m.runs) == 1 and m.copies == [], m.runs
    assert "python3" not in m.runs[0], m.runs[0]


def test_a_half_installed_version_is_redone(tmp_path):
    version = bundle(REPO).version
    # A copy that stopped before READY, and a .tmp left by an interrupted unpack.
    (tmp_path / version / "rdmalab").mkdir(parents=True)
    (tmp_path / version / "rdmalab" / "__init__.py").write_text("raise SystemExit('half')\n")
    (tmp_path / f"{version}.tmp").mkdir()
    got = ensure_agent(CountingMachine(), REPO, agent_dir=str(tmp_path), log=lambda s: None)
    assert got.copied and (tmp_path / version / "READY").exists()
    assert not (tmp_path / f"{version}.tmp").exists()
    assert "half" not in (tmp_path / version / "rdmalab" / "__init__.py").read_text()


def path_without(tmp_path: Path, tool: str) -> str:
    """A PATH with every program this one has except `tool` (a host that lacks it)."""
    farm = tmp_path / "bin"
    farm.mkdir()
    for d in os.environ.get("PATH", "/usr/bin:/bin").split(":") + ["/usr/bin", "/usr/sbin"]:
        if not os.path.isdir(d):
            continue
        for name in os.listdir(d):
            if name != tool and not (farm / name).exists():
                (farm / name).symlink_to(os.path.join(d, name))
    return str(farm)


def test_an_engine_that_does_not_fit_and_no_cmake_names_cmake(unfit_repo, tmp_path):
    env = dict(os.environ, PATH=path_without(tmp_path, "cmake"))
    m = CountingMachine("h2", env=env)
    agents = tmp_path / "agents"
    with pytest.raises(DeployError) as e:
        ensure_agent(m, unfit_repo, agent_dir=str(agents), log=lambda s: None)
    msg = str(e.value)
    # Everything else this machine has: cmake alone is named.
    assert msg.startswith("h2: the controller's engine does not load there (")
    assert msg.endswith("lacks: cmake >= 3.25 (Debian: cmake). Install them: apt-get install cmake")
    version = bundle(unfit_repo).version
    assert not (agents / version / "READY").exists()


def test_version_mismatch_at_start_is_a_clear_error():
    with pytest.raises(DeployError, match="host h3 runs rdmalab agent aaaa, the controller is "
                                          "bbbb: redeploy with rdmalab.machines.deploy.ensure_agent"):
        deploy.check_version("aaaa", "bbbb", "h3")
    deploy.check_version("bbbb", "bbbb", "h3")


@pytest.fixture
def gateway(tmp_path, monkeypatch):
    execnet = pytest.importorskip("execnet", reason="python3-execnet is not installed")
    pytest.importorskip("rpyc", reason="python3-rpyc is not installed")
    # The agent must not find the checkout's package through our environment or cwd.
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.chdir(tmp_path)
    gw = execnet.makegateway("popen//python=/usr/bin/python3")
    yield gw
    gw.exit()


def test_the_agent_starts_from_the_deployed_path_and_checks_its_version(tmp_path, gateway):
    installed = ensure_agent(LocalMachine(), REPO, agent_dir=str(tmp_path / "agents"),
                             log=lambda s: None)
    with pytest.raises(DeployError) as e:
        deploy.open_agent_channel(gateway, installed.path, "0123456789abcdef", "h4")
    assert (f"host h4 runs rdmalab agent {installed.version}, the controller is "
            f"0123456789abcdef: redeploy") in str(e.value)

    import rpyc

    from rdmalab.agent import remote
    channel = deploy.open_agent_channel(gateway, installed.path, installed.version, "h4")
    conn = rpyc.connect_stream(remote.ExecnetStream(channel), service=rpyc.ClassicService,
                               config=remote.RPYC_CONFIG)
    try:
        assert conn.modules["rdmalab"].__file__.startswith(installed.path + "/")
        assert str(REPO / "bindings") not in list(conn.modules["sys"].path)
        assert conn.modules["rdmalab._core"].__name__ == "rdmalab._core"
    finally:
        conn.close()


def test_an_agent_that_is_not_deployed_says_so(tmp_path, gateway):
    with pytest.raises(DeployError, match="h5: .*no rdmalab agent deployed at .*ensure_agent"):
        deploy.open_agent_channel(gateway, str(tmp_path / "nothing"), "0123456789abcdef", "h5")


def test_a_failed_host_build_names_the_host_the_log_and_the_error(tmp_path):
    repo = make_repo(tmp_path / "repo", b"\x7fELF not really an engine\n")
    with open(repo / "core" / "common" / "types.cc", "a") as f:  # compiled first, fails fast
        f.write("this is not C++;\n")
    with pytest.raises(DeployError) as e:
        ensure_agent(LocalMachine("h7"), repo, agent_dir=str(tmp_path / "a"), log=lambda s: None)
    msg = str(e.value)
    assert msg.startswith("h7: building the rdmalab engine failed (rc 10); log ")
    assert "/build.log" in msg and "types.cc:" in msg and "error:" in msg
    assert not list((tmp_path / "a").glob("*/READY"))


@pytest.mark.skipif(os.environ.get("RDMALAB_SLOW_TESTS") != "1",
                    reason="builds the engine on a host from the shipped source (~4 min on 2 "
                           "cores): set RDMALAB_SLOW_TESTS=1")
def test_an_engine_that_does_not_fit_is_built_on_the_host(unfit_repo, tmp_path):
    """The real build from the shipped source (about 3 minutes on 2 cores)."""
    m = CountingMachine("h6")
    logs: list[str] = []
    got = ensure_agent(m, unfit_repo, agent_dir=str(tmp_path), log=logs.append)
    assert got.built_on_host and got.copied, logs
    assert any("built on the host" in line for line in logs)
    v = Path(got.path)
    assert (v / "READY").exists() and (v / "build.log").exists()
    assert not (v / "build").exists() and not (v / "src").exists()  # the tmpfs is small
    r = fresh_python("import rdmalab.labs.engine\nrdmalab.labs.engine.model_lab(seed=1).shutdown()\nprint('ok')",
                     got.path)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr
    m.runs.clear()
    m.copies.clear()
    again = ensure_agent(m, unfit_repo, agent_dir=str(tmp_path), log=logs.append)
    assert again.built_on_host and not again.copied and len(m.runs) == 1 and not m.copies


# -- the agent pool (rdmalab.labs.agent) after a reboot wiped the install ---------------------------

class TmpfsMachine(CountingMachine):
    """This machine as a host whose agent_dir is on a tmpfs, as a VM lab guest's is: powering
    it off wipes what was shipped there (a reboot's fresh tmpfs). It has power commands."""

    def __init__(self, name: str, agent_dir: Path):
        super().__init__(name)
        self.agent_dir, self.boots = agent_dir, 0

    @property
    def can_power(self) -> bool:
        return True

    def power_off(self) -> None:
        shutil.rmtree(self.agent_dir, ignore_errors=True)

    def power_on(self) -> None:
        self.boots += 1

    def power_cycle(self) -> None:
        self.power_off()
        self.power_on()


@pytest.fixture
def pool_on(tmp_path, monkeypatch):
    """(pool on one TmpfsMachine "h8", its agent_dir, the pool's log, the paths the pool
    started agents from); the pool is closed after the test."""
    pytest.importorskip("execnet", reason="python3-execnet is not installed")
    pytest.importorskip("rpyc", reason="python3-rpyc is not installed")
    from rdmalab.labs import agent as agentlab
    monkeypatch.delenv("PYTHONPATH", raising=False)  # the agent sees the shipped copy only
    monkeypatch.chdir(tmp_path)
    started: list[str] = []
    real_open = deploy.open_agent_channel

    def open_agent_channel(gw, path, version, host, timeout=120.0):
        started.append(path)
        return real_open(gw, path, version, host, timeout)

    monkeypatch.setattr(deploy, "open_agent_channel", open_agent_channel)
    agents = tmp_path / "agents"
    logs: list[str] = []
    pool = agentlab.AgentPool(Fleet([TmpfsMachine("h8", agents)], description="local:h8",
                                    agent_dir=str(agents)), log=logs.append)
    try:
        yield pool, agents, logs, started
    finally:
        pool.close()


def shipped(logs) -> int:
    return sum(" copied to " in line for line in logs)


def runs_from(agent, agents: Path) -> str:
    """The deployed version directory agent's package was imported from."""
    path = Path(agent.module("rdmalab").__file__)
    assert path.is_relative_to(agents), f"the agent runs {path}, not a copy under {agents}"
    return path.parents[1].name


def test_the_pool_ships_the_agent_again_where_its_install_is_gone(pool_on):
    """A reboot the pool was not told of (an agent started for a killable process after the
    host rebooted, a host restarted by hand): the install it made is gone, as a guest's tmpfs
    is after a reboot. The start from its old path fails ("no rdmalab agent deployed at"), and
    the pool ships the agent again and starts it from the new copy."""
    pool, agents, logs, started = pool_on
    m = pool.machines[0]
    version = runs_from(pool.agents[0], agents)
    assert shipped(logs) == 1
    pool.agents[0].close()
    m.power_cycle()
    assert not agents.exists()
    pool.agents[0] = pool.start_agent(m)
    assert runs_from(pool.agents[0], agents) == version and (agents / version / "READY").exists()
    assert shipped(logs) == 2, logs
    assert any("does not start (host h8: " in line and "no rdmalab agent deployed at" in line
               for line in logs), logs
    assert started == [str(agents / version)] * 3  # the first start, the blind one, the new one


def test_a_reboot_fault_ships_the_agent_the_reboot_wiped(pool_on):
    """lab.faults.reboot on a host whose agent_dir the reboot wipes: the pool forgets its
    install at the power-off, checks the host once it is back and ships the agent again; it
    never starts the agent blind from the path the reboot emptied. The history says so."""
    pool, agents, logs, started = pool_on
    m = pool.machines[0]
    version = runs_from(pool.agents[0], agents)
    with pool.lab(seed=1, hosts=["a"]) as lab:
        started.clear()
        m.runs.clear()
        lab.faults.reboot("a", 0)
        assert m.boots == 1 and shipped(logs) == 2, logs
        # The probe that found nothing made the directory; the copy of the version an agent
        # loaded before the reboot was not imported again (the agent's start does that).
        ship = [r for r in m.runs if deploy.INSTALLED in r or "tar -xzf" in r]
        assert len(ship) == 2 and "import rpyc" not in ship[1], ship
        assert started == [str(agents / version)], "one start, from the copy just shipped"
        assert not any("does not start" in line for line in logs), logs
        assert runs_from(lab.agent_for("a"), agents) == version
        assert lab.host("a").devices == lab.agent_for("a").lab.host("a").devices
        back = [r["data"] for r in lab.history() if r["kind"] == "host_back"]
        assert len(back) == 1 and back[0]["agent_shipped"] is True, back
    started.clear()
    pool.restart(0)  # a heal: powered off and on again, the same
    assert m.boots == 2 and shipped(logs) == 3 and started == [str(agents / version)]
    assert runs_from(pool.agents[0], agents) == version


def test_an_install_found_there_is_started_unchecked_and_checked_when_that_fails(pool_on):
    """A pool's first start on a host (or one after a reboot) takes an install of its version
    found there by its files and starts it, without importing it first. Where that start
    fails (here: its engine broken after it was made, as a changed host library would), the
    install is checked, found not to load, and shipped again."""
    pool, agents, logs, started = pool_on
    m = pool.machines[0]
    version = runs_from(pool.agents[0], agents)
    pool.agents[0].close()
    pool.forget_install(m)  # as a new pool, or a reboot, would find it
    m.runs.clear()
    pool.agents[0] = pool.start_agent(m)
    assert shipped(logs) == 1 and not any("python3" in r for r in m.runs), m.runs
    pool.agents[0].close()
    pool.forget_install(m)
    [engine] = (agents / version / "rdmalab").glob("_core*.so")
    engine.write_bytes(b"not an ELF")
    started.clear()
    pool.agents[0] = pool.start_agent(m)
    assert shipped(logs) == 2, logs
    assert any("does not start" in line for line in logs), logs
    assert started == [str(agents / version)] * 2  # the unchecked start, then the new copy
    assert runs_from(pool.agents[0], agents) == version
    assert engine.read_bytes() != b"not an ELF"


def test_free_devices_starts_a_new_agent_process_only_after_an_earlier_lab(pool_on):
    """lab.free_devices: the agent that made an earlier lab (librdmacm keeps its device
    contexts until it exits) is replaced by a new process from the same install, without a
    reboot or a ship; an agent on its first lab holds nothing and stays. The history says so."""
    pool, agents, logs, started = pool_on
    m = pool.machines[0]
    with pool.lab(seed=1, hosts=["a"]) as lab:
        first = lab.agent_for("a").pid
        lab.free_devices("a")
        assert lab.agent_for("a").pid == first, "an agent on its first lab was restarted"
        assert not [r for r in lab.history() if r["kind"] == "agent_restart"]
        with pytest.raises(KeyError):
            lab.free_devices("zz")
    with pool.lab(seed=1, hosts=["a"]) as lab:
        started.clear()
        lab.free_devices("a")
        new = lab.agent_for("a")
        assert new.pid != first and new is pool.agents[0]
        assert m.boots == 0 and shipped(logs) == 1 and len(started) == 1, logs
        [rec] = [r for r in lab.history() if r["kind"] == "agent_restart"]
        assert rec["host"] == "a" and rec["data"]["old_pid"] == first
        assert rec["data"]["pid"] == new.pid and rec["data"]["machine"] == m.name
        assert lab.host("a").devices == new.lab.host("a").devices  # the new agent's lab
        assert not _pid_alive(first), f"the old agent (pid {first}) still runs"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text(
    ).split(")")[-1].split()[0]


def test_a_cached_start_that_fails_otherwise_ships_again_and_a_timeout_ends_it(pool_on,
                                                                              monkeypatch):
    """Not only DeployError: a gateway that dies as the old install is started (EOFError,
    OSError) is shipped past too; the run's wall-clock safety net is not swallowed."""
    from rdmalab.errors import WallClockTimeout
    pool, agents, logs, started = pool_on
    m = pool.machines[0]
    real_open = deploy.open_agent_channel
    fail_next: list[BaseException] = []

    def flaky_open(gw, path, version, host, timeout=120.0):
        if fail_next:
            raise fail_next.pop()
        return real_open(gw, path, version, host, timeout)

    monkeypatch.setattr(deploy, "open_agent_channel", flaky_open)
    pool.agents[0].close()
    fail_next.append(EOFError("agent channel closed"))
    pool.agents[0] = pool.start_agent(m)  # the blind start failed: checked, still there
    assert shipped(logs) == 1 and any("does not start (agent channel closed)" in line
                                      for line in logs), logs
    runs_from(pool.agents[0], agents)
    pool.agents[0].close()
    fail_next.append(WallClockTimeout("ran longer than 180 s"))
    with pytest.raises(WallClockTimeout):
        pool.start_agent(m)
    assert pool._installed.get(m.name) is not None  # nothing learnt: the install stays known
