"""Bootstrap resamples of groups: how many times each group is drawn, per resample.

One matrix of draw counts per selection, seeded, is shared by every judge, method and level
of a data set and aspect, so paired judges see the same resamples. Drawing it is most of a
1,000-resample bootstrap's time, so a `Resamples` remembers the matrices it drew (up to
KEPT_CELLS float64 cells in all, 64 MiB) for the next judge: the caller owns it, one per
report set (runner.report.write.correlations), and what it holds goes with it. A matrix past
KEPT_CELLS (past ~8,000 groups at 1,000 resamples) is never held whole: `Draws` makes it a
block of resamples at a time, the same bits.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["KEPT_CELLS", "Draws", "Resamples", "blocks"]

FloatArray = npt.NDArray[np.float64]

KEPT_CELLS = 1 << 23
"""Draw counts a `Resamples` keeps for reuse, in float64 cells (64 MiB)."""
KEPT_COMPACT = 1 << 26
"""Draw counts of larger matrices a `Resamples` keeps, one byte a cell (64 MiB in all): a `Draws`
then converts blocks of them instead of drawing them again for every judge, level and
aspect. What it buys: the correlations of the ten-million-judgment benchmark (12,500 groups,
1,000 resamples, 100 judge-aspect series) took ~60 s drawing each block anew."""
_DRAW_CELLS = 1 << 20
"""Draws of one stratum taken at a time by _draw (int64, 8 MiB)."""


class Resamples:
    """The draw counts of a report set's bootstraps, drawn once per (strata, n_boot, seed).

    Args:
        kept_cells: at most this many float64 cells of matrices kept (oldest dropped first);
            a larger matrix is made a block at a time (`Draws`) whenever asked for.
        kept_compact: such a larger matrix of at most this many cells is kept as uint8,
            each, and its blocks converted from it; a matrix past it is drawn again.
    """

    def __init__(self, kept_cells: int = KEPT_CELLS, kept_compact: int = KEPT_COMPACT) -> None:
        self.kept_cells, self.kept_compact = kept_cells, kept_compact
        self.drawn: dict[tuple[tuple[int, ...], int, int], FloatArray] = {}
        """(strata, n_boot, seed) -> counts, read-only."""
        self.compact: dict[tuple[tuple[int, ...], int, int], npt.NDArray[np.uint8] | None] = {}
        """(strata, n_boot, seed) -> the counts of a matrix past kept_cells as uint8 (None:
        one count passed 255, or the matrix passed KEPT_COMPACT), for `Draws`."""
        self.starts: dict[tuple[tuple[int, ...], int, int], list[Mapping[str, Any]]] = {}
        """Where each stratum's draws start in the seeded stream (for `Draws`): a few hundred
        bytes a stratum, found with one pass over every draw."""

    def counts(self, strata: tuple[int, ...], n_boot: int, seed: int) -> FloatArray | Draws:
        """(n_boot, sum(strata)) times each group is drawn, each stratum drawn within itself.

        Args:
            strata: group counts of consecutive strata, each resampled on its own.
            n_boot: resamples.
            seed: the numpy Generator's seed.
        Returns:
            the matrix (read-only, remembered), or a `Draws` making it in blocks when it is
            larger than `kept_cells`.
        """
        key = (strata, n_boot, seed)
        if (kept := self.drawn.get(key)) is not None:
            return kept
        if n_boot * sum(strata) > self.kept_cells:
            if key not in self.compact:
                compacts = self.compact
                while compacts and sum(c.size for c in compacts.values() if c is not None) \
                        + n_boot * sum(strata) > self.kept_compact:
                    del compacts[next(iter(compacts))]  # the oldest first
                compacts[key] = (_draw_compact(strata, n_boot, seed)
                                 if n_boot * sum(strata) <= self.kept_compact else None)
            if (compact := self.compact[key]) is not None:
                return Draws(strata, n_boot, [], compact)
            if key not in self.starts:
                self.starts[key] = _starts(strata, n_boot, seed)
            return Draws(strata, n_boot, self.starts[key])
        counts = _draw(strata, n_boot, seed)
        counts.flags.writeable = False
        drawn = self.drawn
        while drawn and sum(c.size for c in drawn.values()) + counts.size > self.kept_cells:
            del drawn[next(iter(drawn))]  # the oldest first
        drawn[key] = counts
        return counts


def _draw(strata: tuple[int, ...], n_boot: int, seed: int) -> FloatArray:
    """Each stratum's n_boot x k draws, taken _DRAW_CELLS at a time straight into the result.

    The generator's stream runs on across calls, so the counts are the bits of one
    (n_boot, k) draw per stratum, without holding its int64 draws, their bincount and a
    concatenated copy at once (~4x the result's size at its peak)."""
    out = np.empty((n_boot, sum(strata)), dtype=np.float64)
    _draw_into(out, strata, seed)
    return out


def _draw_compact(strata: tuple[int, ...], n_boot: int, seed: int
                  ) -> npt.NDArray[np.uint8] | None:
    """_draw's matrix as uint8 (the same counts), or None if a count passes 255."""
    out = np.empty((n_boot, sum(strata)), dtype=np.uint8)
    if not _draw_into(out, strata, seed):
        return None
    out.flags.writeable = False
    return out


def _draw_into(out: npt.NDArray[Any], strata: tuple[int, ...], seed: int) -> bool:
    """_draw's counts into `out` (n_boot rows); False, part-filled, if one passes what an
    unsigned integer `out` holds."""
    rng = np.random.default_rng(seed)
    limit = int(np.iinfo(out.dtype).max) if out.dtype.kind == "u" else None
    n_boot, start = len(out), 0
    for k in strata:
        step = max(1, _DRAW_CELLS // max(k, 1))
        for b0 in range(0, n_boot, step):
            rows = min(step, n_boot - b0)
            drawn = _drawn(rng, k, rows)
            if limit is not None and drawn.size and int(drawn.max()) > limit:
                return False
            out[b0:b0 + rows, start:start + k] = drawn
        start += k
    return True


def _drawn(rng: np.random.Generator, k: int, rows: int) -> npt.NDArray[np.intp]:
    """(rows, k) counts of k groups drawn k times with replacement, per row."""
    draws = rng.integers(0, k, size=(rows, k)) + k * np.arange(rows)[:, None]
    return np.bincount(draws.ravel(), minlength=rows * k).reshape(rows, k)


def _starts(strata: tuple[int, ...], n_boot: int, seed: int) -> list[Mapping[str, Any]]:
    """The generator's state where each stratum's draws start (one pass over every draw)."""
    rng, starts = np.random.default_rng(seed), []
    for k in strata:
        starts.append(rng.bit_generator.state)
        step = max(1, _DRAW_CELLS // k)
        for b0 in range(0, n_boot, step):
            rng.integers(0, k, size=(min(step, n_boot - b0), k))
    return starts


class Draws:
    """_draw's matrix of counts, made `step` resamples at a time and never held whole.

    Each stratum gets a generator that starts where that stratum's draws start in the seeded
    stream (the stream runs on across calls, so a block of rows is the same bits as those
    rows of one draw).

    Args:
        strata, n_boot: as for `Resamples.counts`.
        starts: each stratum's generator state (`Resamples.starts`).
        compact: the whole matrix as uint8, if the caller keeps it (`Resamples.compact`):
            blocks are converted from it, not drawn.
    """

    def __init__(self, strata: tuple[int, ...], n_boot: int,
                 starts: list[Mapping[str, Any]],
                 compact: npt.NDArray[np.uint8] | None = None) -> None:
        self.strata, self.n_boot, self.starts = strata, n_boot, starts
        self.compact = compact

    def __len__(self) -> int:
        return self.n_boot

    def blocks(self, step: int) -> Iterator[FloatArray]:
        """The matrix's rows, `step` at a time, in order.

        Args:
            step: the rows per block, bounding the memory held at once.

        Yields:
            The blocks, in order.
        """
        if self.compact is not None:
            compact = self.compact
            yield from (compact[b:b + step].astype(np.float64)
                        for b in range(0, self.n_boot, step))
            return
        rngs = []
        for state in self.starts:
            rng = np.random.default_rng(0)
            rng.bit_generator.state = state
            rngs.append(rng)
        for b0 in range(0, self.n_boot, step):
            rows = min(step, self.n_boot - b0)
            block = np.empty((rows, sum(self.strata)), dtype=np.float64)
            start = 0
            for k, rng in zip(self.strata, rngs, strict=True):
                block[:, start:start + k] = _drawn(rng, k, rows)
                start += k
            yield block
            del block  # before the next is made: one block held at a time, not two


def blocks(counts: FloatArray | Draws, step: int) -> Iterator[FloatArray]:
    """The rows of `counts`, `step` at a time.

    Args:
        counts: resample counts, one row a resample, or Draws that make them on demand.
        step: the rows per block, bounding the memory held at once.

    Returns:
        The blocks, in order.
    """
    if isinstance(counts, Draws):
        return counts.blocks(step)
    return (counts[b:b + step] for b in range(0, len(counts), step))
