"""Greetings."""


def greet(name, greeting="Hi"):
    """A greeting for name, e.g. greet("Ann") == "Hello, Ann!"."""
    return f"{greeting}, {name}!"
