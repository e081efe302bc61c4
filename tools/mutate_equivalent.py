"""The mutants of tools/mutate.py that cannot change behaviour, left out of the score.

Each entry is (module, function the mutant is in ("" at module level), text found in
"<original line> -> <mutated line>", why). Each was read and argued, not just left over: a
mutant that changes behaviour the tests miss belongs in the survivors, not here.
"""

from __future__ import annotations

__all__ = ["EQUIVALENT"]

# Mutants that cannot change behaviour: (module, function, text of "<line> -> <mutated line>",
# why). Each was read and argued, not just left over.
_LIMITER, _PARSERS = "runner/execute/limiter.py", "runner/parse/parsers.py"
_RATINGS, _FORMS = "runner/parse/ratings.py", "runner/parse/forms.py"
_METRICS, _COEF, _KENDALL = ("runner/parse/metrics.py", "runner/reduce/_coef.py",
                             "runner/reduce/_kendall.py")
_REDUCE_CELLS, _CORRELATE = "runner/reduce/cells.py", "runner/reduce/correlate.py"
_RANKING, _LEASE = "runner/reduce/ranking.py", "runner/execute/store/lease.py"
EQUIVALENT: tuple[tuple[str, str, str, str], ...] = (
    (_LIMITER, "__init__", "60 / rpm) if rpm else (0.0)", "the period is only used with rpm"),
    (_LIMITER, "__init__", "tpm / 60 if tpm else (1.0)", "the token rate is only read with tpm"),
    (_LIMITER, "__init__", "max((0), int(rpm))", "under 1 rpm the bucket (one request per "
     "60/rpm s) already keeps every 60 s window to one request"),
    (_LIMITER, "__init__", "maxlen=self._window or (0)", "the deque is only read with a window"),
    (_RATINGS, "parse_number", "float(standalone.group((0)))",
     "_NUMBER's whole match is its one group (the rest are lookarounds)"),
    (_FORMS, "_form_regex", "lru_cache(maxsize=(65))", "a cache's size"),
    (_FORMS, "parse_form", 'found.get(key, ("", (True)))[0]', "only [0] is read"),
    (_PARSERS, "_is_one_group_regex", "return False -> return None",
     "check_options reads it as a bool"),
    (_METRICS, "_scorer", "lru_cache(maxsize=(5))", "a cache's size"),
    (_COEF, "rankdata", "stable=(False)", "tied values get one average rank in any order"),
    (_COEF, "_ties", "cnt[(cnt >= 1)]", "a value seen once ties 1 * 0 // 2 = 0 pairs"),
    (_COEF, "_ties", "cnt[cnt > (0)]", "a value seen once ties 1 * 0 // 2 = 0 pairs"),
    # Speed only: block sizes, the table-or-entries form of Counts and the cost model's choice
    # between merges and the matrix. Every choice is exact, and tests/test_reduce.py checks
    # both forms, both ways and small blocks give the same bits.
    *((_KENDALL, "", line, "a speed knob") for line in (
        "_CELLS = 1 << 22", "_MAX_GROUPS = 4096", "_NS_MERGE, _NS_SIGN, _NS_MAC = 4.5")),
    *((_KENDALL, function, text, "a block size or the choice of an exact way")
      for function, text in (
          ("drawn", "(_CELLS * max(len(self.group), 1))"), ("counts", "n_values < _CELLS)"),
          ("pairs", "(len(edges) + 1)"), ("pairs", "len(edges) - (0)"),
          ("pairs", "max((0), (fewer - 1)"), ("pairs", "((fewer + 1)).bit_length()"),
          ("pairs", "(fewer - (0)).bit_length()"), ("pairs", "(n_groups < _MAX_GROUPS)"),
          ("pairs", "(direct <= merge)"), ("group_signs", "(_CELLS * max(len(x), 1))"),
          ("group_signs", "max((0), _CELLS"), ("group_signs", "(edges[g0] - step)"),
          ("tau_b_rows", "max((0), (1 << 20)"), ("tau_b_rows", "((1 << 20) * max(len(i), 1))"),
          ("tau_b_rows", "((1 >> 20))"), ("tau_b_rows", "((0) << 20)"),
          ("tau_b_rows", "(1 << (21))"))),
    (_KENDALL, "counts", "np.empty((1)", "the entries' arrays are not read in the table form"),
    (_KENDALL, "drawn", "max(len(self.group), (0))", "the entries form has entries"),
    (_KENDALL, "group_signs", "max(len(x), (0))", "pairs builds the matrix only for items"),
    (_KENDALL, "tau_b_rows", "max(len(i), (0))", "rows have 2 or more items, so pairs"),
    (_KENDALL, "plan", "(len(np.unique(x)) < len(np.unique(y)))", "either side may be a"),
    (_KENDALL, "plan", "initial=(1)", "initial is for no cells, or adds a block with none"),
    (_KENDALL, "plan", "initial=-(0)", "initial is only read when there are no cells"),
    # a block's pairs with itself cancel (sign(b_l - b_k) is antisymmetric), and the last odd
    # block has no right partner: adding either to `left` changes no sum
    (_KENDALL, "plan", "| (pair < n_blocks // 2)", "self-pairs cancel"),
    (_KENDALL, "plan", "(pair <= n_blocks // 2)", "the odd block meets no right block"),
    (_KENDALL, "plan", "(pair < (n_blocks * 2))", "the odd block meets no right block"),
    (_KENDALL, "group_signs", "np.triu_indices(n_groups, (0))", "the diagonal onto itself"),
    (_KENDALL, "tau_b_rows", "np.triu_indices(xs.shape[1], (0))", "i == j pairs add the same "
     "count to tot, xtie, ytie and both ties, which cancel"),
    # cells.py. The integer shortcut of _means is exact while every partial sum stays under
    # 2**53: a bound of 2**53 (or <= 2**52) keeps it exact, a smaller one only sends more cells
    # to fsum, which gives the same value (tests/test_cells.py checks 3**52 and max / count).
    (_REDUCE_CELLS, "", "float((2 * 52))", "a smaller bound: fsum, the same value"),
    (_REDUCE_CELLS, "", "float(2 ** (53))", "sums under 2**53 are exact too"),
    (_REDUCE_CELLS, "_means", "<= _EXACT)", "sums at 2**52 are exact too"),
    # zip(strict=True) only checks lengths these columns have by construction
    *((_REDUCE_CELLS, function, "strict=(False)", "columns of one length by construction")
      for function in ("grouped", "_means")),
    (_REDUCE_CELLS, "grouped", "(len(distinct) <= 2 ** 15)",
     "ranks run to len - 1: 32,767 fits int16"),
    (_REDUCE_CELLS, "grouped", "(2 * 15)", "a smaller bound: int32 ranks, the same values"),
    # _Grid's columns for the judges the job lists are made ahead to save widening; a judge
    # without one gets it from column() on first use, under the same judge code (_open codes
    # the listed judges before the grid is made). Any width >= col + 1 holds the new column,
    # and when column() widens, col == stride >= 1, so 2 * stride >= col + 1 already.
    (_REDUCE_CELLS, "__init__", "if (key in self.columns)", "column() makes each on first use"),
    (_REDUCE_CELLS, "__init__", "max(len(self.glob), (0))", "column() widens a zero stride to 1"),
    (_REDUCE_CELLS, "column", "max((3) * self.stride", "a wider grid: more -1 slots"),
    (_REDUCE_CELLS, "column", "(col - 1))", "2 * stride >= col + 1 when widening"),
    (_REDUCE_CELLS, "column", "col + (0))", "2 * stride >= col + 1 when widening"),
    (_REDUCE_CELLS, "add", "(self._grid is None)", "_open returns the grid from self.grids"),
    # array('i'), array('I') and array('d') have the item sizes of int32, uint32 and float64 on
    # every platform CPython's array module builds on with 32-bit C ints: the copy branch is
    # unreachable there, and a copy holds the same values as the view
    (_REDUCE_CELLS, "_column", "(values.itemsize != np.dtype(dtype).itemsize)",
     "a copy: the same values"),
    (_REDUCE_CELLS, "_column", "return np.array(values, dtype=dtype) -> return None",
     "unreachable"),
    # correlate.py's paired bootstrap. _keys codes (group, system, subset) in mixed radix; a
    # field with no labels in either series has no rows to code.
    (_CORRELATE, "_keys", "or [(1)]", "no labels, no rows: the table is never indexed"),
    (_CORRELATE, "_keys", "max(len(known), (0))", "no labels, no rows: any width"),
    (_CORRELATE, "_keys", "(o * width - c)", "with c in [0, width), o * width - c is one to "
     "one as well, and both series are coded alike"),
    (_CORRELATE, "_keys", "strict=(False)", "two lists of two"),
    (_CORRELATE, "compare", "strict=(False)", "the paired series have the same groups, so "
     "the same selections and methods on both sides"),
    # ranking.py's MM fit. p is (resamples, systems) and games (resamples, systems, systems),
    # symmetric in the last two axes; each step rescales p to a geometric mean of 1.
    (_RANKING, "_fit", "p[:, None, :])).sum((1))", "games / (p_i + p_j) is symmetric in i, j"),
    (_RANKING, "_fit", "np.log(new).mean((1)", "axis 1 of a 2-d array is its last"),
    (_RANKING, "_fit", "logs.mean((1)", "axis 1 of a 2-d array is its last"),
    (_RANKING, "_fit", "(logs + logs.mean(", "logs' mean is already 0 up to rounding"),
    (_RANKING, "_fit", "<= TOLERANCE)", "a change of exactly 1e-10"),
    (_RANKING, "_fit", "np.abs((new + p))", "runs to the cap: a fit that moves under 1e-10 "
     "a step moves no strength by the 1e-4 it is rounded to"),
    (_RANKING, "_intervals", "k = wins.shape[(1)]", "wins is (k, k, 3)"),
    (_RANKING, "_intervals", "np.triu_indices(k, (0))", "the diagonal holds no battle: its "
     "zero-probability outcomes draw nothing and take nothing from the random stream"),
    (_LEASE, "__init__", "os.ftruncate(self._fd, (1))", "the description written next from "
     "offset 0 is never empty (describe), so it covers the one byte kept"),
)
