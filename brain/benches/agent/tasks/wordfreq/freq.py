"""Word counts."""

from collections import Counter

from words import words


def top(text, n):
    """The n most common words of text with their counts, most common first."""
    return Counter(words(text)).most_common(n)
