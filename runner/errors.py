"""The one exception tree of judge-runner.

```
RunnerError                     anything the user can act on; `cli` prints one `Error:` line
├── ConfigError                 job file, template, CLI option or environment is wrong (exit 2)
│   └── MissingKeyError         a model needs an API key that is not set (exit 2, before any call)
├── DataError                   a data set is missing, malformed, or fails its sha256 (exit 2)
├── CacheError                  the on-disk cache cannot be opened or written
│   ├── DiskFullError           its disk is full: the pool holds the answers until it has room
│   └── CacheAwayError          its database is away: the pool holds the answers until it is back
├── ReportError                 a report cannot be written (answers stay cached) or read back
└── APIError                    one request failed; the client classifies, `execute` decides
    ├── RetryableError          429, 408, 409, 5xx, dropped connections, timeouts, bad bodies
    │   └── ConnectError        no connection at all: refused, unknown host (a breaker stops)
    ├── RequestError            400, 404, 422: this task fails with the server's message
    └── AuthError               401, 403: the whole run stops at once
```

Every message names the thing, where it is, and the fix, e.g.
`jobs/x.toml: models.judge.rpm must be a positive integer (got 0)`. Text that came from a server
goes through `scrub` before it is kept anywhere: no message carries an API key. A URL (a cache
URL, a base URL, a command line holding them) goes through `redact_url` before it is shown or
written: no password or token in it reaches a file or a line.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

__all__ = [
    "APIError",
    "AuthError",
    "CacheAwayError",
    "CacheError",
    "ConfigError",
    "ConnectError",
    "DataError",
    "DiskFullError",
    "MissingKeyError",
    "ReportError",
    "RequestError",
    "RetryableError",
    "RunnerError",
    "redact_url",
    "register_secret",
    "register_url_password",
    "scrub",
]

_SECRETS: set[str] = set()
"""Every key value this process has read (see register_secret); scrub removes each."""
_KEY_SHAPES = re.compile(
    r"(?i)(?P<bearer>\bbearer\s+)[A-Za-z0-9._~+/=-]{6,}"
    r"|\b(?:sk|pk|rk)-[A-Za-z0-9_-]{8,}"
    r"|\bAIza[0-9A-Za-z_-]{20,}"
    r"|(?P<param>\b(?:api[-_]?key|key|access[-_]?token|token)[\"']?\s*[=:]\s*[\"']?)"
    r"[A-Za-z0-9._~+/-]{12,}")
REDACTED = "[redacted]"
MASK = "***"
"""What replaces a password or a token in a URL: `postgresql://user:***@host/db`."""
_URL_USERINFO = re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^\s/?#@:]*:)[^\s/?#]*@")
"""`scheme://user:PASSWORD@`; the password runs to the last `@` of the authority (an unescaped
`@` in it is the user's mistake, not a reason to leak the rest)."""
_URL_PARAMS = re.compile(
    r"(?i)([?&;](?:\w*password|passwd|pwd|key|api[-_]?key|access[-_]?token|auth[-_]?token|token"
    r"|secret|client[-_]?secret|sig|signature)=)[^&#\s]*")
"""`?key=VALUE`, `&password=VALUE`, ...: a credential in a URL's query (any length)."""


def register_secret(value: str | None) -> None:
    """Remember a key value (from the environment) so `scrub` removes it from any text.

    Args:
        value: the key's value; None, "" and values under 6 characters are not remembered
            (they would blank ordinary words).
    """
    if value and len(value) >= 6:
        _SECRETS.add(value)


def redact_url(text: str) -> str:
    """A URL (or any text holding URLs: a command line) without its passwords and tokens.

    The one redaction of the manifest, the resume line, the progress line and messages. It
    works on the text, never parses it, so a malformed URL (`postgres://u:p@[bad/db`) is
    redacted too instead of raising.

    Args:
        text: a URL, or text with URLs in it.

    Returns:
        `text` with the password of every `scheme://user:password@` and the value of every
        credential query parameter (`password=`, `key=`, `token=`, `secret=`, `sig=`, ...)
        replaced by `MASK`.
    """
    text = _URL_USERINFO.sub(lambda m: m.group(1) + MASK + "@", text)
    return _URL_PARAMS.sub(lambda m: m.group(1) + MASK, text)


def register_url_password(url: str | None) -> None:
    """Remember the password of a URL (a `--cache` URL) as a secret, so `scrub` removes it from
    any text, also where it appears outside the URL (a driver's message).

    Args:
        url: the URL; None, one without a password or one that does not parse is ignored.
    """
    try:
        password = urlsplit(url).password if url else None
    except ValueError:  # a malformed URL: redact_url still masks it in the URL's own text
        return
    if password:
        register_secret(password)
        register_secret(unquote(password))


def scrub(text: str, secrets: tuple[str, ...] = ()) -> str:
    """Text without any key in it: for every text a server sent back, before it is printed or
    written (some gateways echo the Authorization header).

    Args:
        text: the text to clean.
        secrets: key values to remove besides the registered ones (see `register_secret`).

    Returns:
        `text` with every URL's password and query token masked (see `redact_url`), and every
        registered or given key value and anything shaped like a key (`Bearer ...`,
        `sk-...`, `AIza...`, `key=...`) replaced by `REDACTED`.
    """
    text = redact_url(text)
    for secret in (*secrets, *_SECRETS):
        if secret and len(secret) >= 6 and secret in text:
            text = text.replace(secret, REDACTED)
    return _KEY_SHAPES.sub(lambda m: (m.group("bearer") or m.group("param") or "") + REDACTED, text)


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


class DiskFullError(CacheError):
    """The cache folder's disk refused a write for want of space: the pool holds the answers
    and writes them again once there is room (runner.execute.commits), where any other
    CacheError stops the run."""


class CacheAwayError(CacheError):
    """The cache's PostgreSQL server is away and a thread is reconnecting meanwhile
    (PgCache.wait_aside): the pool holds the answers and pauses, its event loop free, until
    the server is back; `place` names the database (no password)."""

    def __init__(self, place: str, wait_s: float) -> None:
        super().__init__(f"cache database at {place} unreachable: waiting up to {wait_s:g} s; "
                         "nothing is lost")
        self.place = place


class ReportError(RunnerError):
    """The report folder cannot be written (a file in its place, no permission, disk full), or a
    report.html read back cannot be read or holds no report data."""


class APIError(RunnerError):
    """One request to a chat-completions endpoint failed.

    Attributes:
        status: HTTP status, or None for connection errors, timeouts and bad bodies.
        retry_after: seconds the server asked us to wait, if it said so.
        kind: a short label: the HTTP status, or "timeout", "connection", "malformed".
        detail: what went wrong, without the label (the server's own message for a status).
    """

    def __init__(self, message: str, *, status: int | None = None,
                 retry_after: float | None = None, kind: str | None = None,
                 detail: str | None = None) -> None:
        """Build the error.

        Args:
            message: the exception's text, already passed through `scrub`.
            status, retry_after, kind, detail: the attributes; `kind` defaults to the status,
                else "error", `detail` to `message`.
        """
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after
        self.kind = kind or (str(status) if status is not None else "error")
        self.detail = detail if detail is not None else message

    @property
    def reason(self) -> str:
        """How a failed task reads everywhere: `429: rate limited`, `timeout: no answer within
        2 s`, `connection: refused`, never a class name."""
        return f"{self.kind}: {self.detail}"


class RetryableError(APIError):
    """Worth another try after a pause: rate limits, server errors, network trouble."""


class ConnectError(RetryableError):
    """No connection could be made (refused, unknown host): retried, but when the first
    attempts to an endpoint all end so, the run stops (`execute`'s breaker)."""


class RequestError(APIError):
    """The server rejected this request (400/404/422); retrying the same body will not help."""


class AuthError(APIError):
    """The server rejected the credentials (401/403); no other request can succeed either."""
