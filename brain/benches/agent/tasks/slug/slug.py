"""URL slugs."""


def slugify(title):
    """The title trimmed, in lower case, words joined by dashes."""
    return "-".join(title.strip().upper().split())
