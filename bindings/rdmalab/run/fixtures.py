"""The plugin's fixtures: lab_spec (parametrized from --lab, ids like "model-ib"), personality,
rdmalab_seed, lab_factory (labs of the test's spec and the run's seed, with other hosts or
options), lab (hosts "a" and "b") and hosts (their Host objects, in order). Every lab a test
made is finished at its teardown (rdmalab.run.histories)."""

from __future__ import annotations

from typing import Optional

import pytest

from . import metrics_pytest
from .histories import finish_labs, start_evidence
from .labspec import DEFAULT_HOSTS, LabSpec, replay_command
from .session import EVIDENCE, LABS, SETTINGS
from ..protocol import Lab


def pytest_generate_tests(metafunc):
    if "lab_spec" not in metafunc.fixturenames:
        return
    if any("lab_spec" in m.args[0] for m in metafunc.definition.iter_markers("parametrize")):
        return  # the test chose its own specs
    specs = metafunc.config.stash[SETTINGS].specs
    metafunc.parametrize("lab_spec", specs, ids=[s.id for s in specs])


@pytest.fixture
def lab_spec(request) -> LabSpec:
    """The lab this test runs on (parametrized from --lab)."""
    return getattr(request, "param", request.config.stash[SETTINGS].specs[0])


@pytest.fixture
def personality(lab_spec) -> str:
    return lab_spec.personality


@pytest.fixture
def rdmalab_seed(request) -> int:
    return request.config.stash[SETTINGS].seed


@pytest.fixture
def lab_factory(request, lab_spec):
    """make(hosts=("a", "b"), seed=None, **model_lab options) -> Lab, of this test's
    personality and (unless seed= is given) the run's seed; every lab is shut down after the
    test and its history written."""
    settings = request.config.stash[SETTINGS]
    labs: list[Lab] = []
    request.node.stash[LABS] = labs
    collectors: list = []
    request.node.stash[EVIDENCE] = collectors

    def make(hosts=DEFAULT_HOSTS, seed: Optional[int] = None, **options) -> Lab:
        lab = lab_spec.build(settings.seed if seed is None else seed, hosts, **options)
        lab.replay = replay_command(request.node, lab_spec, settings.seed)
        labs.append(lab)
        metrics_pytest.attach(request.config, lab)
        collectors.append(start_evidence(request.node, lab, lab_spec, settings, collectors))
        return lab

    yield make
    finish_labs(request.node, labs, settings)


@pytest.fixture
def lab(lab_factory) -> Lab:
    """A two-host lab ("a", "b") of this test's personality."""
    return lab_factory()


@pytest.fixture
def hosts(lab):
    return tuple(lab.hosts.values())
