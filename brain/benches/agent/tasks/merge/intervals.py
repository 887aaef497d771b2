"""Closed intervals."""


def merge(intervals):
    """The union of closed intervals, as sorted, non-overlapping, non-touching intervals."""
    out = []
    for start, end in sorted(intervals):
        if out and start < out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out
