"""`Memo`: a value kept while what it was computed from is what the last call gave.

A cycle usually scores the GPUs, jobs and nodes the last one did, so the tables derived from
them (lookups, sorts, groupings) need not be built again: one comparison instead of the work.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

import numpy as np

T = TypeVar("T")


class Memo(Generic[T]):
    """`get(key, compute)`: the last value while every part of `key` is the last call's (the
    same object, or an equal one: arrays by shape, dtype and values, other parts by `==`),
    else `compute()`. Parts are kept as given: pass none that is changed in place later, and
    a counter for state that is (e.g. how many times a table was refitted)."""

    __slots__ = ("_key", "_value")

    def __init__(self) -> None:
        self._key: tuple[Any, ...] | None = None
        self._value: Any = None

    def get(self, key: tuple[Any, ...], compute: Callable[[], T]) -> T:
        if self._key is None or not _same(self._key, key):
            self._value, self._key = compute(), key
        value: T = self._value
        return value

    def clear(self) -> None:
        self._key = self._value = None


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x is y:
            continue
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            if not (
                isinstance(x, np.ndarray)
                and isinstance(y, np.ndarray)
                and x.shape == y.shape
                and x.dtype == y.dtype
                and np.array_equal(x, y)
            ):
                return False
        elif type(x) is not type(y) or x != y:
            return False
    return True
