"""The house as docs/DESIGN.md ("The rooms") describes it, checked on the source: which room may
import which, modules readable in one sitting, imports inside functions only where they say
why, and no code above the Lab protocol that branches on a backend, a lab class or a
personality's name instead of asking a capability."""

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "bindings" / "rdmalab"
SCENARIOS = PACKAGE.parents[1] / "tests" / "scenarios"
MAX_LINES = 500

# The floor every room stands on: the engine, errors, names and units, the checkout's paths,
# progress lines, the host kernel's facts, the Lab protocol, and the package's face.
FLOOR = {"_core", "errors", "names", "paths", "progress", "kernel", "protocol", "(face)"}
# Each room and the rooms it may import besides the floor (docs/DESIGN.md, "The rooms").
MAY_IMPORT = {
    "faults": set(),
    "checkers": {"faults",                    # the wire records' vocabulary (faults.records)
                 "workloads"},                # the workload records' (workloads.records)
    "findings": set(),
    "workloads": {"machines"},                # the Machine protocol's facts (the spare disk)
    "machines": {"agent"},                    # the container demo drives an agent
    "api": {"agent"},                         # an object that lives in an agent says so
    "labs": {"api", "faults", "machines", "agent", "findings"},
    "agent": {"api", "labs"},                 # the host side serves engine labs
    "schedules": {"api", "labs", "checkers", "findings", "faults", "workloads"},
    "report": {"findings", "machines", "labs", "faults", "checkers"},
    "run": {"api", "labs", "agent", "faults", "machines", "schedules", "checkers", "findings",
            "report"},
}


def modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        room = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        yield path, rel, room


def package_of(rel: Path) -> list[str]:
    parts = ["rdmalab", *rel.with_suffix("").parts]
    return parts[:-1] if parts[-1] != "__init__" else parts[:-1]


def _is_module(name: str) -> bool:
    return (PACKAGE / f"{name}.py").exists() or (PACKAGE / name / "__init__.py").exists() or \
        name == "_core"


def imported_rooms(path: Path, rel: Path):
    """(line, room) of every relative import in a module."""
    pkg = package_of(rel) if rel.name != "__init__.py" else ["rdmalab", *rel.parent.parts]
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom) or not node.level:
            continue
        base = pkg[:len(pkg) - (node.level - 1)]
        targets = ([base + node.module.split(".")] if node.module else
                   [base + [a.name] for a in node.names])
        for t in targets:
            if len(t) == 2 and not _is_module(t[1]):
                t = t[:1]  # a name of the face (`from .. import ms`)
            yield node.lineno, (t[1] if len(t) > 1 else "(face)")


def test_each_room_imports_only_what_it_may():
    wrong = []
    for path, rel, room in modules():
        if room not in MAY_IMPORT:
            continue  # the floor itself, the face and __main__
        for line, target in imported_rooms(path, rel):
            if target != room and target not in FLOOR | MAY_IMPORT[room]:
                wrong.append(f"{rel}:{line}: {room} imports {target}")
    assert not wrong, "\n".join(wrong)


def test_floor_modules_import_only_the_floor():
    wrong = [f"{rel}:{line}: {room} imports {target}" for path, rel, room in modules()
             if room in FLOOR for line, target in imported_rooms(path, rel)
             if target not in FLOOR]
    assert not wrong, "\n".join(wrong)


def test_modules_are_readable_in_one_sitting():
    long = [f"{rel}: {n} lines" for path, rel, _ in modules()
            if (n := len(path.read_text().splitlines())) > MAX_LINES]
    assert not long, "\n".join(long)


def _function_imports(tree):
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    yield node


def test_imports_inside_functions_say_why():
    """Only to break a real cycle or to defer a heavy optional dependency, with a comment on
    the line saying which."""
    silent = []
    for path, rel, _ in modules():
        text = path.read_text()
        lines = text.splitlines()
        for node in _function_imports(ast.parse(text)):
            if "#" not in lines[node.lineno - 1]:
                silent.append(f"{rel}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    assert not silent, "\n".join(silent)


# What a branch on a backend, a lab class or a personality's name looks like.
BRANCHES = [
    re.compile(r"\bbackend\s*(==|!=|\bin\b)"),
    re.compile(r"isinstance\([^)]*\b(ModelLab|VerbsLab|AgentLab|EngineLab)\b"),
    re.compile(r"\bpersonality\s*(==|!=)\s*[\"']"),
    re.compile(r"\bpersonality\s+(not\s+)?in\s*[\(\[{][\"']"),
    re.compile(r"(getattr|hasattr)\((lab|m|machine|self\.lab|self\._lab|self\.lab\.faults)\b"),
]
# Below the protocol (the labs themselves and where hosts come from), and the report, which
# lays out result columns by their recorded backend label after the run.
BELOW = {"labs", "machines", "report"}


@pytest.mark.parametrize("where", ["package", "scenarios"])
def test_nothing_above_the_protocol_branches_on_what_lab_it_has(where):
    files = ([(p, rel) for p, rel, room in modules() if room not in BELOW]
             if where == "package" else
             [(p, p.relative_to(SCENARIOS)) for p in sorted(SCENARIOS.rglob("*.py"))])
    found = []
    for path, rel in files:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if any(b.search(code) for b in BRANCHES):
                found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, "\n".join(found)


def test_every_name_of_the_face_resolves_to_its_home():
    """rdmalab's face resolves its names lazily (PEP 562): each must name a real home, and a
    name it does not have is an AttributeError, as for any module."""
    import rdmalab
    for name in rdmalab.__all__:
        assert getattr(rdmalab, name) is not None, name
    assert {"model_lab", "Lab", "resources", "FaultNotSupported"} <= set(dir(rdmalab))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        rdmalab.nope  # noqa: B018


def test_a_machine_kind_is_its_module_and_its_row():
    """A new Machine kind (say a labgrid place) is one file and one table row (issue 28): each
    pooled lab kind's fleet is a function (name, hosts, log) defined in a module under
    rdmalab.machines, which run.labkinds' row names."""
    import inspect

    from rdmalab.run.labkinds import LAB_KINDS
    pooled = [kind for kind in LAB_KINDS.values() if kind.pooled]
    assert {kind.name for kind in pooled} >= {"vm", "netns", "inventory"}
    wrong = []
    for kind in pooled:
        fn = kind.fleet
        where = f"{fn.__module__}.{fn.__qualname__}"
        if not fn.__module__.startswith("rdmalab.machines.") or fn.__qualname__ != fn.__name__ \
                or fn.__name__ == "<lambda>":
            wrong.append(f"{kind.name}: {where} is not a function of a machines module")
        elif list(inspect.signature(fn).parameters)[:3] != ["name", "hosts", "log"]:
            wrong.append(f"{kind.name}: {where}{inspect.signature(fn)}: not (name, hosts, log)")
    assert not wrong, "\n".join(wrong)
