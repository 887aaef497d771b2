"""Exam results."""


def passed(score, mark):
    """True when score reaches the pass mark (equal to it passes)."""
    return score > mark


def count_passed(scores, mark):
    """How many of the scores pass."""
    return sum(1 for s in scores if passed(s, mark))
