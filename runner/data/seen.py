"""An exact set of 64-bit values (`add`, `in`, `len`) at about 12 bytes a member, for one pass
over millions of things.

A Python set of 10,000,000 sha256 hex keys holds about 1.4 GB (a 113-byte str and a set slot
each), a set of their 64-bit prefixes as ints about 0.7 GB. `Seen` keeps its members in sorted
numpy uint64 runs (8 bytes each), plus a one-hash bitmap of 16 to 32 bits a member that answers
most "not a member" without a search (3-6% of the values never added need one), plus the
newest members (up to `recent`) in a small Python set. Lookups and inserts are one at a time,
1-2 us each; 10,000,000 members hold 80 MB of runs and a 32 MB bitmap.

Membership is exact for 64-bit values. A caller that reduces longer keys to 64 bits (a sha256
key's first 16 hex digits, a str's hash) accepts that two of n distinct keys share a value with
probability at most n^2 / 2^65: 2.7e-6 at 10,000,000 keys, 2.7e-10 at 100,000.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy is imported by the first run (past `recent` members), not before:
    import numpy as np  # `judge --help`, `plan` and `status` of a small job never load it
    import numpy.typing as npt

    Run = npt.NDArray[np.uint64]

__all__ = ["Seen", "key64"]

RECENT_MAX = 1 << 16  # members kept in the Python set before they move to a sorted run
RUN_MAX = 1 << 21  # runs are merged up to this many members (16 MB; a merge holds twice that)
BITMAP_BITS = 16  # bitmap bits a member at least: it doubles when members pass 1/16 of it


def key64(key: str) -> int:
    """A sha256 hex cache key's first 64 bits (the keys are uniform, so are these).

    Args:
        key: a hex string of at least 16 digits.

    Returns:
        Its first 16 hex digits as an int in 0..2^64-1.
    """
    return int(key[:16], 16)


class Seen:
    """Which 64-bit values have been added.

    Invariants: `_runs` are sorted, pairwise disjoint and disjoint from `_recent`; every member
    of a run has its bit (value & _mask) set in `_bits`; `_count` is the members in runs.
    """

    def __init__(self, *, recent: int = RECENT_MAX, run: int = RUN_MAX) -> None:
        """An empty set.

        Args:
            recent: members kept in a Python set before they move to a sorted run.
            run: runs are merged while the merged run holds at most this many members.
        """
        self._recent_max, self._run_max = recent, run
        self._recent: set[int] = set()
        self._runs: list[Run] = []  # empty until the first flush
        self._bits = bytearray(1 << 10)
        self._mask = (len(self._bits) << 3) - 1
        self._count = 0

    def __len__(self) -> int:
        return self._count + len(self._recent)

    def __contains__(self, value: int) -> bool:
        return value in self._recent or self._in_runs(value)

    def add(self, value: int) -> bool:
        """Add a value.

        Args:
            value: an int, 0 <= value < 2^64.

        Returns:
            True if it was not a member yet.
        """
        recent = self._recent
        if value in recent:
            return False
        bit = value & self._mask
        if self._bits[bit >> 3] >> (bit & 7) & 1 and self._in_runs(value):
            return False
        recent.add(value)
        if len(recent) >= self._recent_max:
            self._flush()
        return True

    def _in_runs(self, value: int) -> bool:
        bit = value & self._mask
        if not self._bits[bit >> 3] >> (bit & 7) & 1:
            return False
        import numpy as np

        key = np.uint64(value)  # a Python int above 2^63 would make numpy compare as objects
        for run in self._runs:
            i = int(run.searchsorted(key))
            if i < len(run) and int(run[i]) == value:
                return True
        return False

    def _flush(self) -> None:
        import numpy as np

        new = np.fromiter(self._recent, dtype=np.uint64, count=len(self._recent))
        new.sort()
        self._recent = set()
        self._count += len(new)
        if (len(self._bits) << 3) < BITMAP_BITS * self._count:
            size = len(self._bits)
            while (size << 3) < BITMAP_BITS * self._count:  # 16 to 32 bits a member
                size <<= 1
            self._bits, self._mask = bytearray(size), (size << 3) - 1
            for run in self._runs:
                self._mark(run)
        self._mark(new)
        self._runs.append(new)
        runs = self._runs
        while (len(runs) > 1 and len(runs[-2]) <= 2 * len(runs[-1])
               and len(runs[-2]) + len(runs[-1]) <= self._run_max):
            last = runs.pop()
            merged = np.concatenate((runs.pop(), last))
            merged.sort()
            runs.append(merged)

    def _mark(self, run: Run) -> None:
        import numpy as np

        bits = np.frombuffer(self._bits, dtype=np.uint8)
        position = run & np.uint64(self._mask)
        np.bitwise_or.at(bits, (position >> np.uint64(3)).astype(np.intp),
                         (np.uint8(1) << (position & np.uint64(7)).astype(np.uint8)))
