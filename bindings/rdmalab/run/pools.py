"""The session's machine pools: one per lab spec of a pooled kind (rdmalab.run.labkinds: the VM,
netns and inventory labs), started on first use. The scenarios run column by column, so each
pool lives only while its column runs (2 cores cannot carry two VM labs at once); what a pool
found left on its hosts when it closed is reported at the session's end."""

from __future__ import annotations

from ..labs.agent import AgentPool
from .session import spec_of

_POOLS: dict = {}       # spec -> its AgentPool
_LEAKS: list[str] = []  # what the closed pools found left on their hosts
_HOSTS = [2]            # machines per pool (--vm-hosts)


def set_hosts(n: int) -> None:
    _HOSTS[0] = n


def agent_pool(spec):
    """The session's pool of machines for a spec, started on first use."""
    if spec not in _POOLS:
        _POOLS[spec] = AgentPool(spec.kind.fleet(spec.personality, _HOSTS[0]))
    return _POOLS[spec]


def leaks() -> list[str]:
    return list(_LEAKS)


def close_pools() -> None:
    while _POOLS:
        spec, pool = _POOLS.popitem()
        _close(spec, pool)


def _close(spec, pool) -> None:
    pool.close()
    _LEAKS.extend(f"{spec.option}: {leak}" for leak in pool.leaks)


def order_by_column(items: list, specs: list) -> None:
    """One lab's scenarios together, in --lab order (specs). Caps probing at collection booted
    every pool: all but the first column's go until their column comes."""
    order = {spec: i for i, spec in enumerate(specs)}
    items.sort(key=lambda it: -1 if spec_of(it) is None else order.get(spec_of(it), -1))
    first = next((spec_of(it) for it in items if spec_of(it) in _POOLS), None)
    for spec in [s for s in _POOLS if s != first]:
        _close(spec, _POOLS.pop(spec))


def column_done(item, nextitem) -> None:
    """After a column's last scenario (its fixtures torn down), its machine pool goes."""
    spec = spec_of(item)
    if spec in _POOLS and (nextitem is None or spec_of(nextitem) != spec):
        _close(spec, _POOLS.pop(spec))
