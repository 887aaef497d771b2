"""Splitting text into words."""

import re


def words(text):
    """The words of text, lower-cased, without punctuation."""
    return re.findall(r"[A-Za-z']+", text)
