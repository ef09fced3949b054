"""The findings registry: bindings/rdmalab/findings/findings.toml, one entry per known way a device
differs from what a scenario asserts, keyed by id. From it come the @pytest.mark.finding("<id>")
marker's devices, xfail reason and exception (rdmalab.run.pytest_plugin), the result table's
findings and provider facts (rdmalab.report.junit) and README's findings table (markdown_tables,
`python3 -m rdmalab findings --readme README.md`).

Kinds:
  finding        the device breaks a written rule (IBTA, RFC 5040-5044, a man page, a documented
                 kernel contract): rule (citation and quote), source, writeup required. On its
                 providers the scenario is a strict xfail.
  unclassified   a divergence reproduced on the device whose rule is not established yet: a
                 strict xfail as a finding; to become a finding or a provider fact.
  provider-fact  a difference no rule forbids: the model's personality predicts it and the
                 scenario asserts it, so it passes; the id is recorded on the passing cell.

load() validates everything and raises FindingsError naming the file, line, entry and field of
each problem; check_files() checks the paths an entry names (writeups) against a checkout.
"""

from __future__ import annotations

import builtins
import dataclasses
import functools
import re
import tomllib
from pathlib import Path
from typing import Any, Optional

import rdmalab

from ..kernel import release_version

REGISTRY = Path(__file__).resolve().with_name("findings.toml")


KINDS = ("finding", "unclassified", "provider-fact")
XFAIL_KINDS = ("finding", "unclassified")  # the device fails the scenario where these apply
BEGIN, END = "<!-- findings:begin -->", "<!-- findings:end -->"

_ID = re.compile(r"^[a-z0-9][a-z0-9.+-]*$")
_PROVIDER = re.compile(r"^[a-z0-9_]+$")
_SCENARIO = re.compile(r"^tests/[\w/.-]+\.py::[\w]+$")
_FIELDS = {"kind", "provider", "models", "summary", "rule", "source", "kernels", "reproducer",
           "evidence", "scenario", "raises", "writeup", "kernel_log"}
_RULE_FIELDS = {"citation", "quote"}
_SOURCE_FIELDS = {"file", "function"}
_KERNEL_FIELDS = {"reproduces", "fixed", "checked", "since"}


class FindingsError(ValueError):
    """A malformed registry: one line per problem, `FILE:LINE: [id] field: what is wrong`."""


@dataclasses.dataclass(frozen=True)
class Rule:
    citation: str
    quote: str = ""


@dataclasses.dataclass(frozen=True)
class Source:
    file: str
    function: str = ""

    def __str__(self) -> str:
        return f"{self.file} {self.function}".strip()


@dataclasses.dataclass(frozen=True)
class Kernels:
    reproduces: tuple[str, ...] = ()
    checked: tuple[str, ...] = ()
    fixed: str = ""
    since: str = ""   # "v6.12: ...": the first mainline version known to diverge


@dataclasses.dataclass(frozen=True)
class Entry:
    id: str
    kind: str
    providers: tuple[str, ...]   # kernel driver names: "rxe", "siw", "mlx5"
    models: tuple[str, ...]      # model personalities that copy it: "roce"
    summary: str
    rule: Optional[Rule]
    sources: tuple[Source, ...]
    kernels: Kernels
    reproducer: str
    evidence: str
    scenarios: tuple[str, ...]   # test node ids without parameters
    raises: str
    writeup: str
    # Regexes (re.search, multi-line) of kernel-log splats this entry expects on its
    # providers and kernels: such a splat does not fail the scenario (rdmalab.findings.kernlog).
    kernel_log: tuple[str, ...] = ()

    def expects_splat(self, key: str, kernel_release: str, text: str) -> bool:
        """Whether a splat (its whole text) is one this entry expects on this driver and
        kernel: on the entry's keys and kernels [since, fixed), as applies_to."""
        if not self.kernel_log or not self.applies_to(key, kernel_release):
            return False
        return any(re.search(p, text, re.M) for p in self.kernel_log)

    @property
    def xfails(self) -> bool:
        return self.kind in XFAIL_KINDS

    @property
    def keys(self) -> tuple[str, ...]:
        """What a lab column is matched against: drivers, then "model:<personality>"."""
        return self.providers + tuple(f"model:{m}" for m in self.models)

    def applies_to(self, key: str, kernel_release: str = "") -> bool:
        """key: a device's driver ("rxe") or "model:<personality>"; kernel_release: the
        device's kernel ("6.1.0-56-amd64"): an entry fixed in an older kernel, or one that
        came in with a newer kernel (kernels.since), does not apply."""
        if key not in self.keys:
            return False
        fixed, since, running = self.fixed_in, self.since_in, release_version(kernel_release)
        if since and running and running < since:
            return False
        return not (fixed and running and running >= fixed)

    @property
    def fixed_in(self) -> Optional[tuple[int, int]]:
        """The mainline version kernels.fixed names ("v6.8: ..."), if any."""
        return _version_of(self.kernels.fixed)

    @property
    def since_in(self) -> Optional[tuple[int, int]]:
        """The mainline version kernels.since names ("v6.12: ..."), if any."""
        return _version_of(self.kernels.since)

    def raises_class(self) -> type:
        cls = resolve_exception(self.raises)
        assert cls is not None, self.raises  # load() checked it
        return cls


@dataclasses.dataclass(frozen=True)
class Registry:
    path: Path
    entries: dict[str, Entry]

    def get(self, entry_id: str) -> Entry:
        try:
            return self.entries[entry_id]
        except KeyError:
            raise KeyError(f"no finding {entry_id!r} in {self.path}; known: "
                           f"{', '.join(sorted(self.entries)) or 'none'}") from None

    def __iter__(self):
        return iter(self.entries.values())

    def of_kind(self, kind: str) -> list[Entry]:
        return [e for e in self if e.kind == kind]

    def expected_splat(self, key: str, kernel_release: str, text: str) -> Optional[Entry]:
        """The first entry whose kernel_log expects this splat on this driver and kernel."""
        return next((e for e in self if e.expects_splat(key, kernel_release, text)), None)


def resolve_exception(name: str) -> Optional[type]:
    """An exception class by name: rdmalab's exported errors (Error, Hung, DeadlineExceeded,
    HostLost, CmEventError, ...) or a builtin (AssertionError, TimeoutError)."""
    for namespace in (rdmalab, builtins):
        obj = getattr(namespace, name, None)
        if isinstance(obj, type) and issubclass(obj, BaseException):
            return obj
    return None


# -- loading and validation

@functools.lru_cache(maxsize=None)
def default() -> Registry:
    """The package's registry, loaded once."""
    return load(REGISTRY)


def load(path=REGISTRY) -> Registry:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise FindingsError(f"{path}: cannot read the findings registry: {e}") from e
    return parse(text, path)


def parse(text: str, path=REGISTRY) -> Registry:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise FindingsError(f"{path}: invalid TOML: {e}") from e
    errors: list[str] = []
    entries: dict[str, Entry] = {}
    for entry_id, raw in data.items():
        where = f"{path}:{_line_of(text, entry_id)}: [{entry_id}]"
        if not isinstance(raw, dict):
            errors.append(f"{where}: an entry is a table ([{entry_id}]), not a "
                          f"{type(raw).__name__}")
            continue
        checker = _Checker(where, raw, errors)
        entry = checker.entry(entry_id)
        if entry is not None and not checker.failed:
            entries[entry_id] = entry
    if errors:
        raise FindingsError("\n".join(errors))
    return Registry(path, entries)


def _line_of(text: str, entry_id: str) -> int:
    pattern = re.compile(r'^[ \t]*\[[ \t]*["\']?' + re.escape(entry_id) + r'["\']?[ \t]*\]', re.M)
    m = pattern.search(text)
    return text.count("\n", 0, m.start()) + 1 if m else 1


class _Checker:
    """Reads one entry, appending `where field: problem` to errors for each problem."""

    def __init__(self, where: str, raw: dict, errors: list[str]):
        self.where, self.raw, self.errors = where, raw, errors
        self.failed = False
        self.because = ""  # " for kind 'finding'" once the kind is known

    def error(self, field: str, text: str) -> None:
        self.errors.append(f"{self.where} {field}: {text}")
        self.failed = True

    def unknown(self, table: dict, known: set, prefix: str = "") -> None:
        for key in sorted(set(table) - known):
            self.error(prefix + key, f"unknown field; known: {', '.join(sorted(known))}")

    def string(self, table: dict, key: str, field: str, required: bool) -> str:
        value = table.get(key)
        if value is None:
            if required:
                self.error(field, "required" + self.because)
            return ""
        if not isinstance(value, str) or not value.strip():
            self.error(field, f"a non-empty string, not {value!r}")
            return ""
        return " ".join(value.split())

    def strings(self, table: dict, key: str, field: str, required: bool) -> tuple[str, ...]:
        value = table.get(key)
        if value is None:
            if required:
                self.error(field, "required" + self.because)
            return ()
        items = [value] if isinstance(value, str) else value
        if (not isinstance(items, list) or not items
                or not all(isinstance(x, str) and x.strip() for x in items)):
            self.error(field, f"a string or a non-empty list of strings, not {value!r}")
            return ()
        return tuple(x.strip() for x in items)

    def entry(self, entry_id: str) -> Optional[Entry]:
        raw = self.raw
        if not _ID.match(entry_id):
            self.error("id", "lower-case letters, digits, '.', '+' and '-' only")
        self.unknown(raw, _FIELDS)
        kind = raw.get("kind")
        if kind not in KINDS:
            self.error("kind", f"{kind!r} is not a kind; kinds: {', '.join(KINDS)}"
                       if kind is not None else f"required: one of {', '.join(KINDS)}")
            return None
        self.because = f" for kind {kind!r}"
        finding = kind == "finding"
        xfails = kind in XFAIL_KINDS
        providers = self.strings(raw, "provider", "provider", required=True)
        for p in providers:
            if not _PROVIDER.match(p):
                self.error("provider", f"{p!r}: a kernel driver name (rxe, siw, mlx5, ...); "
                                       "model personalities go in models")
        models = self.strings(raw, "models", "models", required=False)
        known = _personalities()
        for m in models:
            if m.removeprefix("model:") not in known:
                self.error("models", f"{m!r} is not a model personality; personalities: "
                                     f"{', '.join(known)}")
        models = tuple(m.removeprefix("model:") for m in models)
        summary = self.string(raw, "summary", "summary", required=True)
        rule = self.rule(raw.get("rule"), required=finding)
        sources = self.sources(raw.get("source"), required=finding)
        kernels = self.kernels(raw.get("kernels"), required=xfails)
        scenarios = self.strings(raw, "scenario", "scenario", required=True)
        for s in scenarios:
            if not _SCENARIO.match(s):
                self.error("scenario", f"{s!r}: a test node id without parameters, "
                                       "tests/scenarios/test_x.py::test_y")
        reproducer = self.string(raw, "reproducer", "reproducer", required=xfails)
        if reproducer and scenarios and not any(s in reproducer for s in scenarios):
            self.error("reproducer", "one command that runs the entry's scenario (its node id "
                                     f"{scenarios[0]}) on the device")
        if "\n" in str(raw.get("reproducer", "")):
            self.error("reproducer", "one command on one line")
        evidence = self.string(raw, "evidence", "evidence", required=False)
        raises = self.string(raw, "raises", "raises", required=False) or "AssertionError"
        if not xfails and "raises" in raw:
            self.error("raises", f"only for kinds {', '.join(XFAIL_KINDS)} (a provider fact's "
                                 "scenario passes)")
        elif resolve_exception(raises) is None:
            self.error("raises", f"{raises!r} is neither an exception rdmalab exports (Error, "
                                 "Hung, DeadlineExceeded, HostLost, ...) nor a builtin one")
        writeup = self.string(raw, "writeup", "writeup", required=finding)
        if writeup and not re.match(r"^docs/findings/[\w.+-]+\.md$", writeup):
            self.error("writeup", f"{writeup!r}: a path docs/findings/<id>.md")
        kernel_log = self.patterns(raw, "kernel_log")
        return Entry(entry_id, kind, providers, models, summary, rule, sources, kernels,
                     reproducer, evidence, scenarios, raises, writeup, kernel_log)

    def patterns(self, raw: dict, key: str) -> tuple[str, ...]:
        """A list of regexes that compile (kernel_log)."""
        if key not in raw:
            return ()
        value = raw[key]
        if (not isinstance(value, list) or not value
                or not all(isinstance(x, str) and x.strip() for x in value)):
            self.error(key, f"a non-empty list of regexes (strings), not {value!r}")
            return ()
        for p in value:
            try:
                re.compile(p)
            except re.error as e:
                self.error(key, f"{p!r} is not a regex: {e}")
        return tuple(value)

    def rule(self, raw: Any, required: bool) -> Optional[Rule]:
        if raw is None:
            if required:
                self.error("rule", "required" + self.because + ": { citation = \"IBA Vol 1 "
                                   "...\", quote = \"...\" }, the rule the device breaks")
            return None
        if not isinstance(raw, dict):
            self.error("rule", f"a table {{ citation, quote }}, not {raw!r}")
            return None
        self.unknown(raw, _RULE_FIELDS, "rule.")
        return Rule(self.string(raw, "citation", "rule.citation", required=True),
                    self.string(raw, "quote", "rule.quote", required=required))

    def sources(self, raw: Any, required: bool) -> tuple[Source, ...]:
        if raw is None:
            if required:
                self.error("source", "required" + self.because + ": [{ file = \"drivers/...\","
                                     " function = \"...\" }], where the device does it")
            return ()
        items = [raw] if isinstance(raw, dict) else raw
        if not isinstance(items, list) or not items or not all(isinstance(x, dict)
                                                                for x in items):
            self.error("source", f"a list of tables {{ file, function }}, not {raw!r}")
            return ()
        out = []
        for i, item in enumerate(items):
            self.unknown(item, _SOURCE_FIELDS, f"source[{i}].")
            out.append(Source(self.string(item, "file", f"source[{i}].file", required=True),
                              self.string(item, "function", f"source[{i}].function",
                                          required=required)))
        return tuple(out)

    def kernels(self, raw: Any, required: bool) -> Kernels:
        if raw is None:
            if required:
                self.error("kernels", "required" + self.because + ": { reproduces = [...] }, "
                                      "the kernels it was seen on")
            return Kernels()
        if not isinstance(raw, dict):
            self.error("kernels", f"a table {{ reproduces, checked, since, fixed }}, not "
                                  f"{raw!r}")
            return Kernels()
        self.unknown(raw, _KERNEL_FIELDS, "kernels.")
        return Kernels(self.strings(raw, "reproduces", "kernels.reproduces", required=required),
                       self.strings(raw, "checked", "kernels.checked", required=False),
                       self.string(raw, "fixed", "kernels.fixed", required=False),
                       self.string(raw, "since", "kernels.since", required=False))


def _personalities() -> list[str]:
    from .. import _core  # deferred: the registry reads and checks without the engine
    return list(_core.personalities())


def check_files(registry: Registry, repo_root) -> list[str]:
    """What an entry names that a checkout lacks: `[id] writeup: no file PATH`."""
    root = Path(repo_root)
    return [f"{registry.path}: [{e.id}] writeup: no file {root / e.writeup}"
            for e in registry if e.writeup and not (root / e.writeup).is_file()]


# -- README's table

def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _providers(e: Entry) -> str:
    text = ", ".join(e.providers)
    if e.models:
        text += " (and " + ", ".join(f"model:{m}" for m in e.models) + ", which copies it)"
    return text


def _name(e: Entry) -> str:
    return f"[{e.id}]({e.writeup})" if e.writeup else e.id


def _sources(e: Entry) -> str:
    return "; ".join(f"`{s.file}` {s.function}".strip() for s in e.sources) or "-"


def _version_of(text: str) -> Optional[tuple[int, int]]:
    m = re.match(r"^v(\d+)\.(\d+)\b", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _kernels(e: Entry) -> str:
    parts = []
    if e.kernels.reproduces:
        parts.append("reproduces on " + ", ".join(e.kernels.reproduces))
    if e.kernels.checked:
        parts.append("source read: " + ", ".join(e.kernels.checked))
    if e.kernels.since:
        parts.append("since: " + e.kernels.since)
    if e.kernels.fixed:
        parts.append("fixed: " + e.kernels.fixed)
    return "; ".join(parts) or "-"


def _rule(e: Entry) -> str:
    if e.rule is None:
        return "-"
    return f"{e.rule.citation}: \"{e.rule.quote}\"" if e.rule.quote else e.rule.citation


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    return out + ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]


def markdown_tables(registry: Registry) -> str:
    """README's findings block (without the begin/end markers)."""
    out = ["<!-- generated from bindings/rdmalab/findings/findings.toml by `/usr/bin/python3 -m rdmalab "
           "findings --readme README.md`: edit the registry, not this table -->", ""]
    parts = [
        ("finding", "Findings: the device breaks a written rule (a strict xfail on it)",
         ["finding", "provider", "what happens", "rule broken", "source", "kernels"],
         lambda e: [_name(e), _providers(e), e.summary, _rule(e), _sources(e), _kernels(e)]),
        ("unclassified", "Divergences not classified yet: reproduced on the device, the rule "
         "not established (a strict xfail, as a finding); each becomes a finding or a provider "
         "fact", ["divergence", "provider", "what happens", "rule cited", "source", "kernels"],
         lambda e: [_name(e), _providers(e), e.summary, _rule(e), _sources(e), _kernels(e)]),
        ("provider-fact", "Provider facts: differences no rule forbids; the model predicts them "
         "and the scenario asserts them (it passes)",
         ["provider fact", "provider", "what it does", "source"],
         lambda e: [_name(e), _providers(e), e.summary, _sources(e)]),
    ]
    for kind, title, header, row in parts:
        entries = registry.of_kind(kind)
        if not entries and kind == "unclassified":
            continue
        out.append(f"{title}:")
        out.append("")
        out += _table(header, [row(e) for e in entries]) if entries else ["(none)"]
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


def replace_block(text: str, block: str, where: str = "README") -> str:
    """text with what lies between BEGIN and END replaced by block."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < 0 or end < start:
        raise FindingsError(f"{where}: no {BEGIN} ... {END} block to write the table into")
    return text[:start + len(BEGIN)] + "\n" + block + text[end:]


def readme_block(text: str, where: str = "README") -> str:
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < 0 or end < start:
        raise FindingsError(f"{where}: no {BEGIN} ... {END} block")
    return text[start + len(BEGIN):end].lstrip("\n")
