"""The one exception tree of judge-runner.

```
RunnerError                     anything the user can act on; `cli` prints one `Error:` line
├── ConfigError                 job file, template, CLI option or environment is wrong (exit 2)
│   └── MissingKeyError         a model needs an API key that is not set (exit 2, before any call)
├── DataError                   a data set is missing, malformed, or fails its sha256 (exit 2)
├── CacheError                  the on-disk cache cannot be opened or written
└── APIError                    one request failed; the client classifies, `execute` decides
    ├── RetryableError          429, 408, 409, 5xx, connection errors, timeouts, bad bodies
    ├── RequestError            400, 404, 422: this task fails with the server's message
    └── AuthError               401, 403: the whole run stops at once
```

Every message names the thing, where it is, and the fix, e.g.
`jobs/x.toml: models.judge.rpm must be a positive integer (got 0)`.
"""

from __future__ import annotations

__all__ = [
    "APIError",
    "AuthError",
    "CacheError",
    "ConfigError",
    "DataError",
    "MissingKeyError",
    "RequestError",
    "RetryableError",
    "RunnerError",
]


class RunnerError(Exception):
    """Base of every error a user can act on."""


class ConfigError(RunnerError):
    """The job file, a template, a CLI option or the environment is wrong."""


class MissingKeyError(ConfigError):
    """A model needs an API key and the named environment variable is not set."""


class DataError(RunnerError):
    """A data set is missing, malformed, or does not match its registered sha256."""


class CacheError(RunnerError):
    """The response cache cannot be opened or written."""


class APIError(RunnerError):
    """One request to a chat-completions endpoint failed.

    Attributes:
        status: HTTP status, or None for connection errors, timeouts and bad bodies.
        retry_after: seconds the server asked us to wait, if it said so.
    """

    def __init__(self, message: str, *, status: int | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after

    @property
    def kind(self) -> str:
        """A short label for summaries: the HTTP status or the class of failure."""
        return str(self.status) if self.status is not None else type(self).__name__


class RetryableError(APIError):
    """Worth another try after a pause: rate limits, server errors, network trouble."""


class RequestError(APIError):
    """The server rejected this request (400/404/422); retrying the same body will not help."""


class AuthError(APIError):
    """The server rejected the credentials (401/403); no other request can succeed either."""
