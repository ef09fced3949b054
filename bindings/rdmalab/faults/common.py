"""What every lab's faults share: NoFaults, the fault verbs of a backend that applies none of
them (each raises FaultNotSupported naming the lab), and host_name."""

from __future__ import annotations

from ..errors import FaultNotSupported


class NoFaults:
    """Fault verbs of a backend that applies none of them (yet): each raises FaultNotSupported."""

    def __init__(self, lab):
        self._lab = lab

    def kill(self, process) -> None:
        process.kill()

    def clear(self) -> None:
        pass

    def __getattr__(self, fault: str):
        if fault.startswith("_"):
            raise AttributeError(fault)
        reason = self._unsupported_reason(fault)

        def unsupported(*args, **kwargs):
            raise FaultNotSupported(fault, reason)

        return unsupported

    def _unsupported_reason(self, fault: str) -> str:
        return f"{self._lab.description or self._lab.backend} cannot apply this fault"


def host_name(host) -> str:
    """A host given by name or as a Host."""
    return host if isinstance(host, str) else host.name
