"""judge-runner: LLM-as-a-judge evaluation studies, cached, rate-limited and resumable.

The Python API (runner/api.py): `load_job`, `plan`, `run` / `arun`, `rescore`, `results`, and
`TaskSelection`, the selection they take as one value.
"""

# typing.TYPE_CHECKING without importing typing (mypy reads any TYPE_CHECKING as true)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from runner.api import (
        ModelPlan,
        Results,
        RunResult,
        TaskSelection,
        arun,
        load_job,
        plan,
        rescore,
        results,
        run,
    )
    from runner.errors import (
        APIError,
        AuthError,
        CacheAwayError,
        CacheError,
        ConfigError,
        ConnectError,
        DataError,
        DiskFullError,
        MissingKeyError,
        ReportError,
        RequestError,
        RetryableError,
        RunnerError,
    )
del TYPE_CHECKING

__version__ = "0.1.0"

__all__ = [
    "APIError",
    "arun",
    "AuthError",
    "CacheAwayError",
    "CacheError",
    "ConfigError",
    "ConnectError",
    "DataError",
    "DiskFullError",
    "load_job",
    "MissingKeyError",
    "ModelPlan",
    "plan",
    "ReportError",
    "RequestError",
    "rescore",
    "results",
    "Results",
    "RetryableError",
    "run",
    "RunnerError",
    "RunResult",
    "TaskSelection",
    "__version__",
]

_LAZY = {name: "errors" if name.endswith("Error") else "api"
         for name in __all__ if name != "__version__"}
"""The public names by their module (the exceptions runner.errors', the rest runner.api's),
imported on first use (PEP 562): every process imports this package, the store's spawned reader
process included (`python -m runner.execute.store.reader`), and the API's pipeline modules
took them ~0.1 s more to start (-X importtime). And `import runner` is the console entry's
first step (`from runner.cli import judge`), before any handler of ours: importing nothing
there (typing and runner.errors took ~6 ms) leaves a Ctrl-C almost no moment to print a
traceback from (runner.cli.judge catches it after)."""


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib  # noqa: PLC0415 - here, not above: see _LAZY

        module = importlib.import_module(f"runner.{_LAZY[name]}")
        value = getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'runner' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
