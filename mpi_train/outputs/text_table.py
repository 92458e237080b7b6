"""Plain-text tables for the console: each column as wide as its widest cell, names left and figures right."""

from __future__ import annotations

NAME_WIDTH = 40  # a longer name (a --run-name may hold 500 characters) is cut in its middle, not the table widened


def clipped(name: str, width: int = NAME_WIDTH) -> str:
    """`name`, or its start and end around an ellipsis where it is longer than `width`: runs that differ only at
    the end of a long name stay told apart."""
    if len(name) <= width:
        return name
    head = (width - 1) // 2
    return f"{name[:head]}…{name[len(name) - (width - 1 - head):]}"


def text_table(cells: list[list[str]], names: int = 2) -> str:
    """`cells`, the header row first, as aligned lines with a rule under the header: the first `names` columns
    left-aligned and clipped, the rest (figures) right-aligned."""
    cells = [[clipped(value) if column < names else value for column, value in enumerate(row)] for row in cells]
    widths = [max(len(row[column]) for row in cells) for column in range(len(cells[0]))]
    lines = ["  ".join(value.ljust(width) if column < names else value.rjust(width)
                       for column, (value, width) in enumerate(zip(row, widths))) for row in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)
