"""judge-runner: LLM-as-a-judge evaluation studies, cached, rate-limited and resumable."""

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
    "AuthError",
    "CacheError",
    "ConfigError",
    "ConnectError",
    "DataError",
    "MissingKeyError",
    "ReportError",
    "RequestError",
    "RetryableError",
    "RunnerError",
    "__version__",
]
