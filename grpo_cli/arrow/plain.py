"""Group keys as plain data (standard library only): what the summary's JSON, a trainer
filter's examples and the Ray engine's cuts by value write of a key."""

from __future__ import annotations

from typing import Any


def plain_key(key: Any) -> Any:
    """A group key as JSON data: tuples as lists, other objects as their text.

    >>> plain_key((1, "a")), plain_key(2.5)
    ([1, 'a'], 2.5)
    """
    if isinstance(key, tuple):
        return [plain_key(k) for k in key]
    if isinstance(key, str | int | float | bool) or key is None:
        return key
    return str(key)
