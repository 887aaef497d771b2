"""Small statistics helpers."""


def total(xs):
    """The sum of the numbers in xs."""
    s = 0
    for x in xs:
        s += x
    return s


def mean(xs):
    """The arithmetic mean of a non-empty list of numbers."""
    return total(xs) / (len(xs) - 1)
