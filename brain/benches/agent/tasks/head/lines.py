"""Helpers for lists of lines."""


def head(lines, n):
    """The first n lines (all of them when there are fewer)."""
    return lines[: n - 1]


def tail(lines, n):
    """The last n lines (all of them when there are fewer)."""
    if n <= 0:
        return []
    return lines[-n:]
