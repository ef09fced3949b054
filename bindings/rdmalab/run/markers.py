"""The plugin's markers, applied at collection to each test's column:

@pytest.mark.requires("xrc", "srq", "ud", transport="iWARP", event="QP_FATAL"): skip, naming
what the device lacks, when it lacks it.
@pytest.mark.finding("<id>"): an entry of the findings registry (rdmalab/findings/findings.toml):
on its providers a finding or unclassified divergence is a strict xfail, a provider fact is
recorded on the passing cell (JUnit property provider_fact)."""

from __future__ import annotations

from typing import Optional

import pytest

from .. import _core
from ..api.verbs import DeviceCaps
from ..findings import registry as findings
from ..kernel import release_version
from ..names import parse
from .labkinds import LAB_KINDS
from .pools import order_by_column
from .session import ENTRY, FIXED, SETTINGS, registry, spec_of

FEATURES = {"xrc": "XRC", "srq": "SRQ", "ud": "UD"}


def unmet_requirement(mark, caps: DeviceCaps) -> Optional[str]:
    """Why a device does not meet @requires(...), or None if it does."""
    dev = f"device {caps.name} (personality {caps.personality})"
    for feature in mark.args:
        if feature not in FEATURES:
            raise pytest.UsageError(f"requires({feature!r}): unknown feature; "
                                    f"known: {', '.join(FEATURES)}")
        if not getattr(caps, feature):
            return (f"requires {feature}: no {FEATURES[feature]} on {caps.personality} "
                    f"({dev})")
    unknown = set(mark.kwargs) - {"transport", "event"}
    if unknown:
        raise pytest.UsageError(f"requires(): unknown keyword(s) {sorted(unknown)}; "
                                "known: transport, event")
    transports = _as_list(mark.kwargs.get("transport"))
    if transports:
        wanted = [parse(_core.Transport, t, "transport").name for t in transports]
        if caps.transport not in wanted:
            return f"requires transport={'|'.join(wanted)}: {dev} is {caps.transport}"
    for event in _as_list(mark.kwargs.get("event")):
        ev = parse(_core.AsyncEventType, event, "async event type").name
        if caps.raises_event(ev) is False:  # None: the device does not say; run and see
            return f"requires event={ev}: {dev} does not raise {ev}"
    return None


def _as_list(value) -> list:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def finding_entry(mark, reg: Optional[findings.Registry] = None) -> findings.Entry:
    """The registry entry a @finding("<id>") names (pytest.UsageError if it names none)."""
    reg = reg if reg is not None else findings.default()
    usage = ('@pytest.mark.finding("<id>"): one argument, the id of an entry in '
             f"{reg.path}")
    if len(mark.args) != 1 or mark.kwargs or not isinstance(mark.args[0], str):
        given = ", ".join([repr(a) for a in mark.args]
                          + [f"{k}={v!r}" for k, v in mark.kwargs.items()])
        raise pytest.UsageError(f"{usage}; got finding({given[:200]}). The old form "
                                "finding(devices, name, text, raises=...) is gone: its fields "
                                "are the entry's provider, id, summary and raises")
    try:
        return reg.get(mark.args[0])
    except KeyError as e:
        raise pytest.UsageError(f"@pytest.mark.finding({mark.args[0]!r}): {e.args[0]}") from e


def finding_on(mark, spec, reg: Optional[findings.Registry] = None
               ) -> Optional[tuple[findings.Entry, str]]:
    """(entry, key) where @finding("<id>") applies to this lab, else None. The key is the
    device's driver ("rxe") on agent labs, "model:<personality>" on the model: a model
    personality carries an entry only where the entry names it (one that copies a device)."""
    entry = finding_entry(mark, reg)
    caps = spec.caps()
    key = LAB_KINDS[spec.backend].finding_key(caps)
    release = getattr(caps, "kernel_release", "")  # a fixed kernel no longer diverges
    return (entry, key) if entry.applies_to(key, release) else None


def finding_reason(entry: findings.Entry, key: str, spec) -> str:
    return f"{entry.kind} {entry.id} on {key} ({spec.caps().name}): {entry.summary}"


def pytest_collection_modifyitems(config, items):
    """Turns unmet @requires into skip marks, so a skip points at the test itself, and
    @finding into a strict xfail where it applies; then orders the tests column by column."""
    for item in items:
        spec = spec_of(item)
        if spec is None:
            continue
        _apply_requires(item, spec)
        for mark in item.iter_markers("finding"):
            _apply_finding(item, spec, mark, registry(config))
    order_by_column(items, config.stash[SETTINGS].specs)


def _apply_requires(item, spec) -> None:
    for mark in item.iter_markers("requires"):
        reason = unmet_requirement(mark, spec.caps())
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
            return


def _apply_finding(item, spec, mark, reg: findings.Registry) -> None:
    found = finding_on(mark, spec, reg)
    if found is None:
        entry = finding_entry(mark, reg)
        if spec.kind.finding_key(spec.caps()) in entry.keys:
            # Fixed in this kernel, or not there yet: it must pass.
            running = release_version(spec.caps().kernel_release)
            before = entry.since_in and running and running < entry.since_in
            item.stash[FIXED] = ("finding_before" if before else "finding_fixed", entry.id)
        return
    entry, key = found
    if ENTRY in item.stash:
        raise pytest.UsageError(f"{item.nodeid}: two findings apply on {key}: "
                                f"{item.stash[ENTRY][0].id} and {entry.id}")
    item.stash[ENTRY] = found
    if entry.xfails:
        item.add_marker(pytest.mark.xfail(strict=True, raises=entry.raises_class(),
                                          reason=finding_reason(entry, key, spec)))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if spec_of(item) is None and item.get_closest_marker("requires") is not None:
        pytest.fail(f"{item.nodeid}: @requires needs a lab (use the lab, hosts or lab_factory "
                    "fixture)", pytrace=False)
