"""judge-runner: LLM-as-a-judge evaluation studies, cached, rate-limited and resumable.

The Python API (runner/api.py): `load_job`, `plan`, `run` / `arun`, `rescore`, `results`.
"""

from runner.api import (
    ModelPlan,
    Results,
    RunResult,
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
    CacheError,
    ConfigError,
    ConnectError,
    DataError,
    MissingKeyError,
    ReportError,
    RequestError,
    RetryableError,
    RunnerError,
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
    "__version__",
]
