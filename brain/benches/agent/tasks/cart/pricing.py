"""Discount rules."""

THRESHOLD = 100
RATE = 0.10


def discount(subtotal):
    """The discount on an order: RATE of it when it reaches THRESHOLD, else nothing."""
    if subtotal > THRESHOLD:
        return round(subtotal * RATE, 2)
    return 0
