"""An iterator that runs through a per-epoch iterator ``n`` times (torch's
``CyclingIterator``): ``generator_fn(epoch)`` gives epoch ``epoch``'s items, for
``epoch`` = ``start_epoch`` … ``n - 1``; then ``StopIteration``.  An epoch with no
items is passed over (without recursion, however many there are in a row).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

__all__ = ["CyclingIterator"]

_T = TypeVar("_T")


class CyclingIterator(Iterator[_T]):
    """Cycle through ``generator_fn(epoch)`` for epochs ``start_epoch`` .. ``n - 1``.

    With ``generator_fn`` always returning ``iter([1, 2, 3])``, ``CyclingIterator(2, fn)``
    yields 1, 2, 3, 1, 2, 3.  The first epoch's iterator is made at construction.
    """

    def __init__(
        self, n: int, generator_fn: Callable[[int], Iterator[_T]], start_epoch: int = 0
    ) -> None:
        self._n = n
        self._epoch = start_epoch
        self._generator_fn = generator_fn
        self._iter = generator_fn(start_epoch)

    def __iter__(self) -> CyclingIterator[_T]:
        return self

    def __next__(self) -> _T:
        while True:
            try:
                return next(self._iter)
            except StopIteration:
                if self._epoch >= self._n - 1:
                    raise
                self._epoch += 1
                self._iter = self._generator_fn(self._epoch)
