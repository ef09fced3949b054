"""The fault switch's benchmark harness (bench/switch_bench.cc, bench/switch.py) works: a --quick
run measures a positive frame rate and latency on the direct link and through the switch with 0
and with 100 rules, none of the rules matching a frame. Skips when the bench tool is not built
(`make bench` builds it; or cmake --build BUILD --target rdmalab_bench_switch rdmalab-switch).
RDMALAB_BUILD names the CMake build folder (default: build)."""
from __future__ import annotations

import os
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # the bench package lives at the repository root

from bench import switch  # noqa: E402


def build_folder() -> pathlib.Path:
    b = pathlib.Path(os.environ.get("RDMALAB_BUILD", "build"))
    return b if b.is_absolute() else REPO / b


@pytest.fixture(scope="module")
def quick_run():
    for exe in switch.binaries(build_folder()):
        if not exe.exists():
            pytest.skip(f"{exe} is not built (cmake --build {build_folder()} --target "
                        f"{'rdmalab-switch' if exe.name == 'rdmalab-switch' else exe.name})")
    # Not pinned: this run checks that the tool still measures, and on a loaded machine (make test
    # beside the guests and stress-ng) the one CPU it would be pinned to starved the switch for
    # the bench's 2-s stall limit. make bench pins it (bench/switch.py: pinned_cpu).
    return switch.measure(build_folder(), quick=True, cpu=None)


def test_quick_run_measures_every_path(quick_run):
    data = quick_run
    n = data["rules"]
    assert n == 100
    assert data["rules_matched"] == 0
    paths = {r["path"] for r in data["results"]}
    assert paths == {"direct", "switch_0_rules", f"switch_{n}_rules"}
    for r in data["results"]:
        what = f"{r['path']}, {r['payload']} B"
        assert r["sent"] > 0 and r["delivered"] > 0, what
        assert r["sent_per_s"] > 0 and r["delivered_per_s"] > 0, what
        assert r["delivered"] <= r["sent"], what
        assert r["wrong_size"] == 0, what
        lat = r["latency"]
        assert lat["round_trips"] > 0 and lat["one_way_median_us"] > 0, what
        assert lat["one_way_p99_us"] >= lat["one_way_median_us"], what
        if r["via_switch"]:  # what the switch took in is what A sent; what it lost, it counted
            assert r["switch_received"] == r["sent"], what
            assert r["switch_flooded"] == 0, what  # both MACs learned before measuring
            assert r["delivered"] + r["switch_dropped"] <= r["sent"], what
        else:
            assert r["lost"] == 0, what  # the direct link makes A wait, never drops


def test_figures_set_each_switch_path_against_the_direct_link(quick_run):
    figs = switch.figures(quick_run)
    assert len(figs) == 4 * len(quick_run["sizes"])
    for f in figs:
        assert f.section == "switch" and f.reference_name == "direct link"
        assert f.value > 0 and f.reference and f.reference > 0, f.name
        assert f.better == ("higher" if f.unit == "frames/s" else "lower"), f.name
    assert any("100 rules" in f.name for f in figs)
