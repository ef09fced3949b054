"""Shipping the agent (lab.deploy) to a host, played by this machine (lab.localmachine): the
install, the no-op second time, a fresh interpreter that sees only the deployed copy, the
build-on-host path (its dependency check, and one real build), and the version check when the
agent starts over execnet."""

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # lab/ is a package at the repository root
    sys.path.insert(0, str(REPO))

from lab import deploy  # noqa: E402
from lab.deploy import DeployError, bundle, ensure_agent  # noqa: E402
from lab.localmachine import LocalMachine  # noqa: E402

ENGINE = REPO / "bindings" / "rdmalab" / f"_core{deploy._ext_suffix()}"
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
    for d in deploy._engine_dirs(REPO):  # core, faults, bench, bindings: what CMake adds
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
    assert not any(s.startswith("bindings/rdmalab") for s in b.sources)
    assert "bindings/rdmalab/agent.py" in b.package
    assert "bindings/rdmalab/findings.toml" in b.package  # the package's data ships with it
    assert b.platform == deploy._ext_suffix().strip(".").removesuffix(".so")
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
    assert {"rdmalab/__init__.py", "rdmalab/agent.py", "rdmalab/findings.toml",
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
        "import rdmalab, rdmalab._core, rdmalab.lab\n"
        f"assert not any(p.startswith({str(REPO / 'bindings')!r}) for p in sys.path)\n"
        "assert rdmalab.__file__.startswith(sys.path[0]), rdmalab.__file__\n"
        "lab = rdmalab.lab.model_lab(seed=1)\n"
        "lab.shutdown()\n"
        "print('model lab ok', open(sys.path[0] + '/rdmalab/DEPLOYED_VERSION').read())",
        first.path)
    assert r.returncode == 0, r.stderr
    assert f"model lab ok {first.version}" in r.stdout


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
                                          "bbbb: redeploy with lab.deploy.ensure_agent"):
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

    from rdmalab import remote
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
    r = fresh_python("import rdmalab.lab\nrdmalab.lab.model_lab(seed=1).shutdown()\nprint('ok')",
                     got.path)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr
    m.runs.clear()
    m.copies.clear()
    again = ensure_agent(m, unfit_repo, agent_dir=str(tmp_path), log=logs.append)
    assert again.built_on_host and not again.copied and len(m.runs) == 1 and not m.copies
