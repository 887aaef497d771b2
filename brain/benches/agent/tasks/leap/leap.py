"""Gregorian leap years."""


def is_leap(year):
    """True for leap years: divisible by 4, except centuries not divisible by 400."""
    return year % 4 == 0 and (year % 100 != 0 or year % 40 == 0)
