"""Where a key of a TOML text is set, so that a mistake in an experiment file can name its line.

tomllib gives values only; the text is scanned for the key in its table.
"""

from __future__ import annotations

import re

_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(r"""^\s*((?:"[^"]*"|'[^']*'|[A-Za-z0-9_\-]+)(?:\s*\.\s*(?:"[^"]*"|'[^']*'|[A-Za-z0-9_\-]+))*)\s*=""")


def _parts(dotted: str) -> tuple[str, ...]:
    return tuple(part.strip().strip("\"'") for part in re.findall(r"""\s*("[^"]*"|'[^']*'|[^.]+)\s*""", dotted))


def locate(text: str, path: tuple) -> int | None:
    """The 1-based line where `path` (e.g. ("sweep", 1, "sync") or ("train", "batch_size")) is set, else where
    its nearest enclosing key or table is (a key inside an inline table, a required key that is missing)."""
    for end in range(len(path), 0, -1):
        line = _line_of(text, path[:end])
        if line:
            return line
    return None


def _line_of(text: str, path: tuple) -> int | None:
    current: tuple = ()
    seen: dict[tuple, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        header = _HEADER.match(line)
        if header:
            current = _table_path(_parts(header.group(2)), header.group(1) == "[[", seen)
            if current == path:
                return number
            continue
        key = _KEY.match(line)
        if key and current + _parts(key.group(1)) == path:
            return number
    return None


def _table_path(names: tuple[str, ...], array: bool, seen: dict[tuple, int]) -> tuple:
    """A table header's path, with the 0-based element of each array table on it; counts `[[...]]` in `seen`."""
    resolved: tuple = ()
    for name in names[:-1]:  # a sub-table of an array table belongs to its latest element
        resolved += (name,)
        if resolved in seen:
            resolved += (seen[resolved] - 1,)
    resolved += (names[-1],)
    if array:
        seen[resolved] = seen.get(resolved, 0) + 1
        resolved += (seen[resolved] - 1,)
    return resolved


def key_label(path: tuple) -> str:
    """sweep[2].sync for ("sweep", 1, "sync"): what the user calls the key (1-based tables)."""
    label = ""
    for part in path:
        label += f"[{part + 1}]" if isinstance(part, int) else (f".{part}" if label else part)
    return label
