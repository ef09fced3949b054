"""Finding lines in an inventory's text: tomllib keeps no positions, so the line of a field is
found by scanning the text: the `[[host]]` block it belongs to, then `key =` inside it."""
from __future__ import annotations

import re
from typing import Optional

_HEADER_RE = re.compile(r"\s*(\[\[?)\s*([^\]\[]+?)\s*\]\]?\s*(#.*)?$")


def _key_re(key: str) -> re.Pattern:
    k = re.escape(key)
    return re.compile(rf"\s*(?:{k}|\"{k}\"|'{k}')\s*[=.]")


class Lines:
    """Line numbers of tables and keys in the inventory's text (1-based)."""

    def __init__(self, text: str):
        self.lines = text.splitlines()
        self.headers: list[tuple[int, str, bool]] = []  # (index, name, is array-of-tables)
        for i, line in enumerate(self.lines):
            m = _HEADER_RE.match(line)
            if m:
                name = re.sub(r"\s*\.\s*", ".", m.group(2)).replace('"', "").replace("'", "")
                self.headers.append((i, name, m.group(1) == "[["))

    def block(self, table: str, index: Optional[int]) -> tuple[int, int]:
        """[start, end) line indexes of `[table]` or of the index-th `[[table]]`, its
        sub-tables included; (0, 0) when absent."""
        seen = -1
        for n, (i, name, _) in enumerate(self.headers):
            if name != table:
                continue
            seen += 1
            if index is not None and seen != index:
                continue
            end = len(self.lines)
            for j, other, _ in self.headers[n + 1:]:
                if not other.startswith(table + "."):
                    end = j
                    break
            return i, end
        return 0, 0

    def find(self, table: str, index: Optional[int], path: tuple[str, ...]) -> int:
        """The line of `path` inside a table (or the closest line that holds it)."""
        start, end = self.block(table, index)
        if end == 0:
            return self._top(path)
        best = start + 1
        lo, hi = start + 1, end
        prefix = table
        for depth, key in enumerate(path):
            prefix += "." + key
            sub = self._sub(prefix, lo, hi)
            if sub is not None:                     # [host.ssh] style
                best, lo, hi = sub[0] + 1, sub[0] + 1, sub[1]
                continue
            hit = self._key(key, lo, hi)
            if hit is None:
                return best
            best = hit + 1
            rest = path[depth + 1:]
            if rest and re.match(rf"\s*[\"']?{re.escape(key)}[\"']?\s*\.", self.lines[hit]):
                dotted = self._dotted((key,) + rest, lo, hi)   # ssh.port = ... style
                return dotted + 1 if dotted is not None else best
            return best                              # an inline table is one line
        return best

    def _top(self, path: tuple[str, ...]) -> int:
        for i, name, _ in self.headers:
            if path and (name == path[0] or name.startswith(path[0] + ".")):
                return i + 1
        end = self.headers[0][0] if self.headers else len(self.lines)
        hit = self._key(path[0], 0, end) if path else None
        return hit + 1 if hit is not None else 1

    def _sub(self, name: str, lo: int, hi: int) -> Optional[tuple[int, int]]:
        for n, (i, h, _) in enumerate(self.headers):
            if lo - 1 <= i < hi and h == name:
                nxt = [j for j, _, _ in self.headers[n + 1:]]
                return i, min(nxt[0] if nxt else len(self.lines), hi)
        return None

    def _key(self, key: str, lo: int, hi: int) -> Optional[int]:
        r = _key_re(key)
        for i in range(lo, hi):
            if r.match(self.lines[i]):
                return i
        return None

    def _dotted(self, path: tuple[str, ...], lo: int, hi: int) -> Optional[int]:
        r = re.compile(r"\s*" + r"\s*\.\s*".join(rf"[\"']?{re.escape(k)}[\"']?" for k in path)
                       + r"\s*=")
        for i in range(lo, hi):
            if r.match(self.lines[i]):
                return i
        return None

    def word(self, word: str) -> int:
        """The first line where `word =` appears as a key anywhere (inline tables too)."""
        r = re.compile(r"(^|[\s{,.]|[\"'])" + re.escape(word) + r"[\"']?\s*=", re.I)
        for i, line in enumerate(self.lines):
            if r.search(line.split("#", 1)[0]):
                return i + 1
        return 1
