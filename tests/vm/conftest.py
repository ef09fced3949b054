"""The inventory the tests under tests/vm run against: RDMALAB_INVENTORY names one already up
(`python3 -m rdmalab.machines.vmlab up`, as make test-vm-rxe does); without it each test boots two rxe guests
itself. Skipped, saying why, where qemu cannot run."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from rdmalab.machines.qemu import qemu_unavailable

ROOT = pathlib.Path(__file__).resolve().parents[2]
_WHY = qemu_unavailable()


@pytest.fixture
def inventory(tmp_path):
    if _WHY is not None:
        pytest.skip(f"the VM lab cannot run here: {_WHY}")
    given = os.environ.get("RDMALAB_INVENTORY")
    if given:
        yield pathlib.Path(given)
        return
    inv = tmp_path / "inv.toml"
    vmlab = [sys.executable, "-m", "rdmalab.machines.vmlab"]
    r = subprocess.run(vmlab + ["up", "--device", "rxe", "--hosts", "2", "--inventory", str(inv)],
                       cwd=ROOT, capture_output=True, text=True, timeout=400,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        yield inv
    finally:
        subprocess.run(vmlab + ["down", "--inventory", str(inv)], cwd=ROOT, timeout=120,
                       stdin=subprocess.DEVNULL, capture_output=True)
