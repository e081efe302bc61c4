"""judge-runner: LLM-as-a-judge evaluation studies, cached, rate-limited and resumable.

The Python API (runner/api.py): `load_job`, `plan`, `run` / `arun`, `rescore`, `results`, and
`TaskSelection`, the selection they take as one value.
"""

import typing

from runner.errors import (
    APIError,
    AuthError,
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

if typing.TYPE_CHECKING:
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

__version__ = "0.1.0"

__all__ = [
    "APIError",
    "arun",
    "AuthError",
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

_API = frozenset({"ModelPlan", "Results", "RunResult", "TaskSelection", "arun", "load_job",
                  "plan", "rescore", "results", "run"})
"""Names of runner.api, imported on first use (PEP 562): every process imports this package,
the store's spawned reader process included (`python -m runner.execute.store.
reader`), and the API's pipeline modules took them ~0.1 s more to start (-X importtime)."""


def __getattr__(name: str) -> object:
    if name in _API:
        from runner import api  # here, not above: see _API
        value = getattr(api, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'runner' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})
