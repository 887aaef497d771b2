"""Keeping numbers within bounds."""


def clamp(x, lo, hi):
    """lo if x is below lo, hi if x is above hi, else x."""
    if x < lo:
        return lo
    if x > hi:
        return hi
