"""Mutation testing of a few modules, each against its own tests (`make mutate`).

A mutant is the module's source with one small change made on its syntax tree: a comparison
flipped (`<` to `<=`, `==` to `!=`, `in` to `not in`, ...), an arithmetic or bitwise operator
swapped, `and` for `or`, a `not` or unary minus removed, a number changed (0 to 1, 1 to 0, n to
n + 1), True for False, or a `return x` made `return None`. The change is spliced into the
original text (the rest of the file stays byte for byte), in a scratch copy of the project, so
the work tree is never touched.

Each mutant runs in its own pytest process (`-x -q -p no:cacheprovider`, bytecode writing off so
a stale .pyc cannot mask it) with a timeout. A baseline run per target, with the
tools/mutate_trace.py plugin, records which test functions execute which lines: a mutant runs
only against the tests that execute its line (fastest first), and a mutant on a line no test
executes is a survivor without a run. That gives the same verdict as the whole file with -x in a
fraction of the time. Mutants that cannot change behaviour are listed, with the reason, in
EQUIVALENT (tools/mutate_equivalent.py) and left out of the score.

    python tools/mutate.py [--only parse/] [--jobs 2] [--out tools/mutate-results.json]
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NoReturn

from mutate_equivalent import EQUIVALENT

ROOT = Path(__file__).resolve().parents[1]

# The parsers' own tests: test_parse.py, and test_judges.py for the json and number parsers and
# the result-key rule (without it, forms.py's json parser is barely reached). Whole files, not
# test ids: a mutant that breaks the import must fail collection (exit 2), not miss an id (4).
_PARSER_TESTS = ("tests/test_parse.py", "tests/test_judges.py")

TARGETS: dict[str, tuple[str, ...]] = {
    **{f"runner/parse/{name}.py": _PARSER_TESTS
       for name in ("parsers", "base", "ratings", "forms")},
    "runner/parse/metrics.py": tuple(f"tests/test_colossalai.py::test_{name}" for name in (
        "bleu_and_chrf_are_sacrebleu_sentence_scores",
        "rouge_english_is_rouge_score_and_chinese_counts_characters",
        "tokens_distinct_and_overlap_by_hand",
        "compute_leaves_out_reference_metrics_without_a_reference")),  # its "automatic metrics"
    "runner/reduce/_coef.py": ("tests/test_reduce.py",),
    "runner/reduce/_kendall.py": ("tests/test_reduce.py",),
    # the pool with a tokens-per-minute limit alone is the only test of `unlimited`
    "runner/execute/limiter.py": ("tests/test_limiter.py",
                                  "tests/test_execute.py::test_tpm_limit_alone_holds_in_the_pool"),
    # scrub and register_secret; the CLI-level leak tests run in subprocesses, out of reach
    "runner/errors.py": ("tests/test_scrub.py", "tests/test_client.py"),
    "runner/execute/breaker.py": ("tests/test_breaker.py",),
    # tests that reach the module in this process: a test that runs `judge` in a subprocess
    # cannot be traced, and only slows the mutants of module-level lines
    "runner/selection.py": ("tests/test_selection.py",
                            *(f"tests/test_sample.py::test_{name}" for name in (
                                "a_draw_takes_whole_groups_until_n_items",
                                "the_seed_chooses_the_draw"))),
    "runner/execute/store/lease.py": tuple(f"tests/test_lease.py::test_{name}" for name in (
        "each_backend_lets_one_holder_at_a_time_and_says_who",
        "a_lease_is_named_by_job_and_shard_with_an_id_stable_across_versions",
        "a_holder_s_description_names_it_without_a_password",
        "a_released_folder_lease_names_no_holder",
        "a_second_holder_quotes_the_first_4_kib_of_the_description",
        "a_lease_taken_by_another_run_while_the_connection_was_down_stops_the_holder")),
    "runner/reduce/cells.py": ("tests/test_cells.py",),
    # the Bradley-Terry tests alone: the rest of test_judges.py runs `judge` in subprocesses
    "runner/reduce/ranking.py": tuple(f"tests/test_judges.py::test_{name}" for name in (
        "two_systems_have_the_closed_form_strengths",
        "the_fit_solves_the_bradley_terry_equations_and_has_cis",
        "a_system_that_wins_every_battle_has_a_finite_fitted_strength",
        "a_single_battle_or_none_still_fits",
        "the_cis_are_percentiles_of_the_fit_over_resampled_battles",
        "the_ranking_section_of_report_md")),
    "runner/reduce/correlate.py": ("tests/test_reduce.py",),
}

# A target mutated in these functions only: correlate.py's paired bootstrap (`compare` and
# what only it calls); the levels' statistics it shares with `correlate` are left out.
FUNCTIONS: dict[str, frozenset[str]] = {
    "runner/reduce/correlate.py": frozenset({"compare", "_keys", "_duplicate", "_take", "_pair",
                                             "_comparison"}),
}

_COMPARE = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
            ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In,
            ast.Is: ast.IsNot, ast.IsNot: ast.Is}
_BINARY = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
           ast.FloorDiv: ast.Mult, ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult,
           ast.LShift: ast.RShift, ast.RShift: ast.LShift, ast.BitOr: ast.BitAnd,
           ast.BitAnd: ast.BitOr, ast.BitXor: ast.BitOr, ast.MatMult: ast.Mult}
_SKIP_FIELDS = {"annotation", "returns", "type_comment"}  # never evaluated (future annotations)


@dataclass(frozen=True, slots=True)
class Mutant:
    """One change: the byte span [start, end) of the source replaced by `text`."""

    module: str
    line: int
    end_line: int
    start: int
    end: int
    text: str
    description: str
    source_line: str  # the mutated node's first line, stripped
    after: str = ""  # that line as the mutant has it, stripped
    function: str = ""  # the function it is in ("" at module level)


    def apply(self, source: bytes) -> bytes:
        return source[:self.start] + self.text.encode() + source[self.end:]


def _symbol(op: ast.AST) -> str:
    """`<` for an ast.Lt: the operator as written, read back from an unparsed expression."""
    if isinstance(op, ast.cmpop):
        return ast.unparse(ast.Compare(ast.Name("a"), [op], [ast.Name("b")]))[2:-2]
    if isinstance(op, ast.operator):
        return ast.unparse(ast.BinOp(ast.Name("a"), op, ast.Name("b")))[2:-2]
    return "and" if isinstance(op, ast.And) else "or"


def _changes(node: ast.AST) -> Iterator[tuple[ast.AST, str]]:
    """(replacement node, description) for every mutation of `node` itself."""
    if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            ops = list(node.ops)
            ops[i] = _COMPARE[type(op)]()
            yield (ast.Compare(node.left, ops, node.comparators),
                   f"{_symbol(op)} -> {_symbol(ops[i])}")
    elif isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in _BINARY:
        new = _BINARY[type(node.op)]()
        desc = f"{_symbol(node.op)} -> {_symbol(new)}"
        if isinstance(node, ast.BinOp):
            yield ast.BinOp(node.left, new, node.right), desc
        else:
            yield ast.AugAssign(node.target, new, node.value), desc
    elif isinstance(node, ast.BoolOp):
        other = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        yield ast.BoolOp(other, node.values), f"{_symbol(node.op)} -> {_symbol(other)}"
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
        yield node.operand, f"remove {'not' if isinstance(node.op, ast.Not) else 'unary -'}"
    elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
        yield ast.Constant(not node.value), f"{node.value} -> {not node.value}"
    elif isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        value = node.value
        new_value = type(value)(1 - value if value in (0, 1) else value + 1)
        yield ast.Constant(new_value), f"{value!r} -> {new_value!r}"
    elif isinstance(node, ast.Return) and node.value is not None and not (
            isinstance(node.value, ast.Constant) and node.value.value is None):
        yield ast.Return(ast.Constant(None)), "return None"


def _nodes(node: ast.AST, function: str = "") -> Iterator[tuple[ast.AST, str]]:
    """(node, enclosing function) for every node worth mutating, in source order; annotations
    and f-strings left out (an f-string only formats a message, and Python 3.11 gives its parts
    no usable positions)."""
    if isinstance(node, ast.JoinedStr):
        return
    yield node, function
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        function = node.name
    for field, value in ast.iter_fields(node):
        if field in _SKIP_FIELDS:
            continue
        for child in value if isinstance(value, list) else [value]:
            if isinstance(child, ast.AST):
                yield from _nodes(child, function)


def mutants(module: str, source: bytes) -> list[Mutant]:
    """Every mutant of `module` whose source still compiles."""
    tree = ast.parse(source)
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    lines = source.decode().splitlines()
    out = []
    for node, function in _nodes(tree):
        if not isinstance(node, (ast.expr, ast.stmt)) or node.end_lineno is None:
            continue
        start = starts[node.lineno - 1] + node.col_offset  # offsets are UTF-8 bytes
        end = starts[node.end_lineno - 1] + (node.end_col_offset or 0)
        for new, description in _changes(node):
            text = ast.unparse(new)
            text = text if isinstance(new, ast.stmt) else f"({text})"
            mutant = Mutant(module, node.lineno, node.end_lineno, start, end, text, description,
                            lines[node.lineno - 1].strip())
            mutated = mutant.apply(source)
            try:
                compile(mutated, module, "exec", dont_inherit=True)
            except SyntaxError:
                continue
            after = mutated.decode().splitlines()[node.lineno - 1].strip()
            out.append(dataclasses.replace(mutant, after=after, function=function))
    return out


def equivalent(mutant: Mutant) -> str | None:
    """The reason `mutant` is listed as equivalent, or None."""
    for module, function, text, reason in EQUIVALENT:
        if (mutant.module, mutant.function) == (module, function) and \
                text in f"{mutant.source_line} -> {mutant.after}":
            return reason
    return None


# --- running ------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Coverage:
    """From a target's baseline run: test function -> (lines of the module it runs, seconds)."""

    tests: dict[str, tuple[frozenset[int], float]]
    imported: frozenset[int]  # lines run when the module is imported
    seconds: float  # the whole baseline run

    def select(self, mutant: Mutant, default: tuple[str, ...]) -> tuple[str, ...]:
        """The tests that execute the mutant's lines, fastest first; all the target's tests
        for module-level code; none when no test executes it."""
        span = set(range(mutant.line, mutant.end_line + 1))
        hit = sorted((seconds, test) for test, (lines, seconds) in self.tests.items()
                     if span & lines)
        if hit:
            return tuple(test for _, test in hit)
        return default if span & self.imported else ()


@dataclass(frozen=True, slots=True)
class Result:
    module: str
    line: int
    description: str
    source_line: str
    status: str  # killed, survived, timeout, uncovered (survived without a run), equivalent
    seconds: float
    after: str  # the mutated line
    reason: str = ""


def scratch_copy() -> Path:
    """The work tree's files that git does not ignore (as they are now) in a temp dir."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=ROOT, check=True,
                            capture_output=True).stdout.decode().split("\0")
    copy = Path(tempfile.mkdtemp(prefix="mutate-"))
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    return copy


def _env(copy: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": f"{copy}{os.pathsep}{copy / 'tools'}",
           "PYTHONDONTWRITEBYTECODE": "1", **extra}
    data = ROOT.parent / "shared" / "datasets"
    if "JUDGE_DATA_DIR" not in env and data.is_dir():
        env["JUDGE_DATA_DIR"] = str(data)
    return env


def baseline(copy: Path, module: str, tests: tuple[str, ...]) -> tuple[Coverage, list[str]]:
    """Run the target's tests unmutated in a subprocess with the tracing plugin (they must
    pass): the coverage, and the third-party modules the tests import."""
    out = copy / f".trace-{Path(module).stem}.json"
    path = os.path.realpath(copy / module)
    started = time.perf_counter()
    code = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                           "-p", "mutate_trace", *tests], cwd=copy, check=False,
                          env=_env(copy, MUTATE_TRACE_FILES=path, MUTATE_TRACE_OUT=str(out)),
                          stdout=subprocess.DEVNULL).returncode
    if code != 0:
        sys.exit(f"Error: {', '.join(tests)} fail on the unmutated code (exit {code}); "
                 "fix them before mutating")
    trace = json.loads(out.read_text())
    lines = {key: frozenset(n for f, n in hits if f == path)
             for key, hits in trace["lines"].items()}
    imported = lines.pop("<import>", frozenset())
    tested = {t: (lines.get(t, frozenset()), d) for t, d in trace["durations"].items()}
    return Coverage(tested, imported, time.perf_counter() - started), trace["modules"]


def warm(modules: list[str]) -> None:
    """Import the tests' third-party modules here, once: every mutant's process is forked
    from this one and starts with them loaded (numpy, scipy, hypothesis, aiohttp, pytest and
    its plugins: 1-2 s a mutant). Nothing of the project is imported here, so each fork
    imports the mutated module afresh."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in modules:
            with contextlib.suppress(Exception):
                importlib.import_module(name)


def _child(copy: Path, tests: tuple[str, ...]) -> NoReturn:
    """In the forked process: run pytest on `tests` in the copy, exit with its code."""
    code = 3
    try:
        os.setsid()  # its own process group, so a timeout kills what the tests started too
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.chdir(copy)
        os.environ.update(_env(copy))
        sys.dont_write_bytecode = True  # a stale .pyc of an earlier mutant cannot run
        sys.path[:0] = [str(copy), str(copy / "tools")]
        import pytest

        # plugins imported by `warm` cannot have their asserts rewritten: that is all right
        code = int(pytest.main(["-x", "-q", "-p", "no:cacheprovider", "-W",
                                "ignore::pytest.PytestAssertRewriteWarning", *tests]))
    finally:
        os._exit(code)


@dataclass(slots=True)
class _Running:
    pid: int
    mutant: Mutant
    copy: Path
    started: float
    deadline: float


def _finish(run: _Running, code: int | None, source: bytes) -> Result:
    (run.copy / run.mutant.module).write_bytes(source)
    # exit 1: a test failed; 2: collection failed (the mutant broke the import); 3: internal
    # error; 4: usage error, which after a passing baseline is a conftest.py that no longer
    # imports (the mutant broke it); 5 (nothing collected) means a bad test selection
    status = {None: "timeout", 0: "survived", 5: "error"}.get(code, "killed")
    m = run.mutant
    return Result(m.module, m.line, m.description, m.source_line, status,
                  round(time.monotonic() - run.started, 2), m.after)


def run_mutants(copies: list[Path], todo: list[tuple[Mutant, tuple[str, ...], float]],
                source: bytes) -> Iterator[Result]:
    """Run each (mutant, tests, timeout) in a forked process, one per copy at a time."""
    queue, free, running = list(reversed(todo)), list(copies), list[_Running]()
    try:
        yield from _schedule(queue, free, running, source)
    finally:  # interrupted: end the children still running (each is its own process group)
        for run in running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.pid, signal.SIGKILL)
            os.waitpid(run.pid, 0)
            (run.copy / run.mutant.module).write_bytes(source)


def _schedule(queue: list[tuple[Mutant, tuple[str, ...], float]], free: list[Path],
              running: list[_Running], source: bytes) -> Iterator[Result]:
    """Start mutants while a copy is free, reap the finished ones and the overdue."""
    while queue or running:
        while queue and free:
            mutant, tests, timeout = queue.pop()
            copy = free.pop()
            (copy / mutant.module).write_bytes(mutant.apply(source))
            pid = os.fork()
            if pid == 0:
                _child(copy, tests)
            now = time.monotonic()
            running.append(_Running(pid, mutant, copy, now, now + timeout))
        for run in list(running):
            pid, status = os.waitpid(run.pid, os.WNOHANG)
            if not pid and time.monotonic() < run.deadline:
                continue
            code = os.waitstatus_to_exitcode(status) if pid else None
            if not pid:
                os.killpg(run.pid, signal.SIGKILL)
                os.waitpid(run.pid, 0)
            running.remove(run)
            free.append(run.copy)
            yield _finish(run, code, source)
        time.sleep(0.005)


def mutate_target(copies: list[Path], module: str, tests: tuple[str, ...]) -> list[Result]:
    """Every mutant of one module: baseline, then the mutants over the copies in parallel."""
    cover, modules = baseline(copies[0], module, tests)
    warm(modules)
    source = (copies[0] / module).read_bytes()
    (check,) = run_mutants(copies[:1], [(Mutant(module, 0, 0, 0, 0, "", "none", ""), tests,
                                         10 + 3 * cover.seconds)], source)
    if check.status != "survived":
        sys.exit(f"Error: {', '.join(tests)} do not pass when forked from tools/mutate.py "
                 f"({check.status}); run them by hand to see why")
    results: list[Result] = []
    todo = []
    for mutant in mutants(module, source):
        if module in FUNCTIONS and mutant.function not in FUNCTIONS[module]:
            continue
        reason, selected = equivalent(mutant), cover.select(mutant, tests)
        if reason or not selected:
            results.append(Result(module, mutant.line, mutant.description, mutant.source_line,
                                  "equivalent" if reason else "uncovered", 0.0, mutant.after,
                                  reason or ""))
        else:
            # a module-level line runs all the target's tests: the whole baseline's time
            seconds = cover.seconds if selected is tests else sum(
                cover.tests[t][1] for t in selected if t in cover.tests)
            todo.append((mutant, selected, 10 + 3 * min(seconds, cover.seconds)))
    for n, result in enumerate(run_mutants(copies, todo, source), 1):
        results.append(result)
        if result.status != "killed":
            print(f"  [{n}/{len(todo)}] {result.status}: {module}:{result.line} "
                  f"{result.description}: {result.after}", flush=True)
    return sorted(results, key=lambda r: r.line)


def summary(results: list[Result]) -> dict[str, float]:
    """Counts by status and the score: killed (timeouts included) over the mutants that can
    change behaviour."""
    counts = {s: sum(r.status == s for r in results)
              for s in ("killed", "survived", "uncovered", "timeout", "equivalent", "error")}
    counted = len(results) - counts["equivalent"]
    score = 100.0 * (counts["killed"] + counts["timeout"]) / counted if counted else 100.0
    return {"mutants": len(results), **counts, "score": round(score, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="targets whose path contains this text")
    parser.add_argument("--jobs", type=int, default=2, help="mutants run at once")
    parser.add_argument("--out", type=Path, default=ROOT / "tools" / "mutate-results.json")
    args = parser.parse_args()
    copies = [scratch_copy() for _ in range(max(1, args.jobs))]
    report: dict[str, object] = {"modules": {}, "survivors": []}
    started = time.perf_counter()
    try:
        for module, tests in TARGETS.items():
            if args.only not in module:
                continue
            print(f"{module} against {', '.join(tests)}", flush=True)
            results = mutate_target(copies, module, tests)
            report["modules"][module] = summary(results)  # type: ignore[index]
            report["survivors"] += [asdict(r) for r in results  # type: ignore[operator]
                                    if r.status in ("survived", "uncovered", "error")]
    finally:
        for copy in copies:
            shutil.rmtree(copy, ignore_errors=True)
    args.out.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    print(f"\n{'module':32} mutants killed survived timeouts equivalent score")
    low = False
    for module, s in report["modules"].items():  # type: ignore[attr-defined]
        print(f"{module:32} {s['mutants']:7} {s['killed']:6} "
              f"{s['survived'] + s['uncovered'] + s['error']:8} {s['timeout']:8} "
              f"{s['equivalent']:10} {s['score']:5}%")
        low = low or s["score"] < 90
    print(f"\n{time.perf_counter() - started:.0f} s; survivors in {args.out}")
    return 1 if low else 0


if __name__ == "__main__":
    sys.exit(main())
