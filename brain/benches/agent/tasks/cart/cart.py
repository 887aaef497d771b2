"""A cart of (price, quantity) lines."""

from pricing import discount


def subtotal(lines):
    return sum(price * qty for price, qty in lines)


def total(lines):
    s = subtotal(lines)
    return round(s - discount(s), 2)
