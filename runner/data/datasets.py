"""Data sets as `Item`s: the registered benchmarks (`REGISTRY`, read from `registry.toml` next to
this module: each one's exact upstream files, their sha256 and size) and the user's own files
(`load_file`, runner.data.userfile). The CLI passes `data_dir` in; nothing here reads the
environment or prints.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import tomllib
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any, BinaryIO

from runner.data.loaders import LOADERS, Item
from runner.data.userfile import FieldMap, load_file
from runner.errors import ConfigError, DataError

__all__ = ["REGISTRY", "DatasetInfo", "FieldMap", "Item", "RemoteFile", "fetch", "load",
           "load_file", "verify"]

_RAW_PREFIX = "https://raw.githubusercontent.com"
_CHUNK = 1 << 16
_TIMEOUT = 60.0  # seconds per blocking socket operation, not for the whole file


@dataclass(frozen=True, slots=True, kw_only=True)
class RemoteFile:
    """One upstream file of a registered data set."""

    path: str  # where it lives, relative to `data_dir` (POSIX separators)
    url: str  # raw.githubusercontent.com URL pinned to an upstream commit
    sha256: str  # hex digest of the exact upstream bytes
    size: int  # in bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class DatasetInfo:
    """What a registered data set is, where its files come from, and what items carry."""

    name: str
    description: str
    license: str  # upstream license, and the terms of the underlying data
    files: tuple[RemoteFile, ...]
    aspects: tuple[str, ...]  # aspects with human scores (empty when the set has none)
    fields: tuple[str, ...]  # template field names its items carry
    lower_is_better: frozenset[str]  # metric names where lower is better; reduce negates them
    subsets: tuple[str, ...]  # empty when the set has none
    answer: str | None = None  # the field holding the judged text (length bias); None = none


def _read_registry() -> dict[str, DatasetInfo]:
    registry = resources.files("runner.data").joinpath("registry.toml")
    table = tomllib.loads(registry.read_text("utf-8"))
    return {name: DatasetInfo(
        name=name, description=entry["description"], license=entry["license"],
        files=tuple(RemoteFile(**file) for file in entry["files"]),
        aspects=tuple(entry["aspects"]), fields=tuple(entry["fields"]),
        lower_is_better=frozenset(entry["lower_is_better"]), subsets=tuple(entry["subsets"]),
        answer=entry.get("answer"),
    ) for name, entry in table.items()}


REGISTRY: Mapping[str, DatasetInfo] = MappingProxyType(_read_registry())
"""Registered data sets by name, in priority order."""

_OPTIONS = ("subsets", "systems")


def _info(name: str) -> DatasetInfo:
    if name not in REGISTRY:
        raise ConfigError(f"unknown data set {name!r}; registered: {', '.join(REGISTRY)} "
                          "(or give a file with a field mapping)")
    return REGISTRY[name]


# ------------------------------------------------------------------- registered sets


def load(name: str, data_dir: Path, *,
         options: Mapping[str, Any] | None = None) -> Iterator[Item]:
    """Read a registered data set from its upstream files under `data_dir`.

    Files are checked for presence here, at call time, not hashed (`verify` does that).
    Items come in file order, grouped by source where the upstream file is.

    Args:
        name: A key of `REGISTRY`.
        data_dir: The directory holding the registered files at their `RemoteFile.path`.
        options: `subsets` (list of subset names) and `systems` (list of system names)
            keep only matching items. Any other key is an error.

    Returns:
        An iterator of `Item`s.

    Raises:
        ConfigError: Unknown name or option, unknown subset, a requested system that no
            item has (raised when the iterator is exhausted), or `geval_prompts`, which
            holds prompt files only and has no items.
        DataError: A file is missing (message names it and the fix) or malformed.
    """
    info = _info(name)
    loader = LOADERS[name]
    if loader is None:
        raise ConfigError(f"data set {name!r} holds prompt files, not items: use its files "
                          f"({', '.join(f.path for f in info.files)}) as prompt templates")
    subsets, systems = _options(info, options or {})
    paths = [data_dir / remote.path for remote in info.files]
    for path in paths:
        if not path.is_file():
            raise DataError(f"{path}: missing file of data set {name!r}; run "
                            f"`judge datasets fetch {name}` or set JUDGE_DATA_DIR")
    return _filtered(loader(paths, name), name, subsets, systems)


def _options(info: DatasetInfo, options: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise ConfigError(f"data set {info.name!r}: unknown option {unknown[0]!r}; "
                          f"options are {', '.join(_OPTIONS)}")
    for key in _OPTIONS:
        value = options.get(key, [])
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"data set {info.name!r}: option {key!r} must be a list of "
                              f"names (got {value!r})")
    subsets, systems = (set(options.get(key, [])) for key in _OPTIONS)
    bad = sorted(subsets - set(info.subsets))
    if bad:
        known = ", ".join(info.subsets) or "none"
        raise ConfigError(f"data set {info.name!r}: unknown subset {bad[0]!r}; "
                          f"subsets are: {known}")
    return subsets, systems


def _filtered(items: Iterator[Item], name: str, subsets: set[str],
              systems: set[str]) -> Iterator[Item]:
    seen: set[str] = set()
    for item in items:
        seen.add(item.system)
        if (not subsets or item.subset in subsets) and (not systems or item.system in systems):
            yield item
    missing = sorted(systems - seen)
    if missing:
        raise ConfigError(f"data set {name!r}: no item has system {missing[0]!r}; "
                          f"systems are: {', '.join(sorted(seen))}")


def verify(name: str, data_dir: Path) -> list[tuple[str, str]]:
    """Hash every registered file of a data set.

    Args:
        name: A key of `REGISTRY`.

    Returns:
        One `(RemoteFile.path, status)` per file, status "ok", "missing" or
        "sha256 mismatch" (a wrong size counts as a mismatch).

    Raises:
        ConfigError: Unknown name.
    """
    return [(remote.path, _status(data_dir / remote.path, remote)) for remote in _info(name).files]


def _status(path: Path, remote: RemoteFile) -> str:
    if not path.is_file():
        return "missing"
    if path.stat().st_size == remote.size:
        with path.open("rb") as file:
            if hashlib.file_digest(file, "sha256").hexdigest() == remote.sha256:
                return "ok"
    return "sha256 mismatch"


def fetch(name: str, data_dir: Path, *, mirror: str | None = None) -> list[Path]:
    """Download the files of a data set that are missing or fail their sha256.

    Each file is streamed into a temporary file next to its destination, checked
    against the registered size and sha256, and renamed into place only if it matches,
    so an interrupted or corrupt download never leaves a partial file behind.

    Args:
        name: A key of `REGISTRY`.
        data_dir: The data directory; created as needed.
        mirror: Replaces "https://raw.githubusercontent.com" in each URL, keeping
            `/OWNER/REPO/COMMIT/PATH`, e.g. "http://127.0.0.1:8000".

    Returns:
        The paths written, in registry order (empty if everything was intact).

    Raises:
        ConfigError: Unknown name, or a mirror that is not an http(s) or file URL.
        DataError: A download failed or did not match its registered sha256.
    """
    info = _info(name)
    if mirror is not None and urllib.parse.urlsplit(mirror).scheme not in {"http", "https",
                                                                            "file"}:
        raise ConfigError(f"mirror {mirror!r} must be an http://, https:// or file:// URL")
    written = []
    for remote in info.files:
        dest = data_dir / remote.path
        if _status(dest, remote) == "ok":
            continue
        url = remote.url
        if mirror is not None and url.startswith(_RAW_PREFIX):
            url = mirror.rstrip("/") + url[len(_RAW_PREFIX):]
        _download(url, dest, remote)
        written.append(dest)
    return written


def _download(url: str, dest: Path, remote: RemoteFile) -> None:
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, temp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part",
                                         dir=dest.parent)
    except OSError as exc:
        raise DataError(f"{dest.parent}: cannot write ({exc.strerror}); use a writable "
                        "data directory (JUDGE_DATA_DIR)") from None
    temp = Path(temp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            digest = _stream(url, out, remote)
            out.flush()
            os.fsync(out.fileno())
        if digest != remote.sha256:
            raise DataError(f"{url}: sha256 {digest} does not match the registered "
                            f"{remote.sha256} for {remote.path}; nothing was written, "
                            "check the mirror or report a changed upstream")
        os.replace(temp, dest)  # atomic on one file system: readers see old or new, never half
    finally:
        temp.unlink(missing_ok=True)


def _stream(url: str, out: BinaryIO, remote: RemoteFile) -> str:
    """Copy the response body to `out`; return its sha256. Sizes are checked as we go."""
    import urllib.error  # here: ~20 ms of every command's start-up otherwise
    import urllib.request
    from http.client import HTTPException

    digest, size = hashlib.sha256(), 0
    fix = f"{remote.path} was not written; check the network or pass a mirror"
    try:
        with urllib.request.urlopen(url, timeout=_TIMEOUT) as response:
            while chunk := response.read(_CHUNK):
                size += len(chunk)
                if size > remote.size:
                    break
                digest.update(chunk)
                out.write(chunk)
    except urllib.error.HTTPError as exc:
        raise DataError(f"{url}: HTTP {exc.code} {exc.reason}; {fix}") from None
    except urllib.error.URLError as exc:
        raise DataError(f"{url}: download failed ({exc.reason}); {fix}") from None
    except (OSError, HTTPException) as exc:
        raise DataError(f"{url}: download failed ({exc!r}); {fix}") from None
    if size != remote.size:
        raise DataError(f"{url}: got {'more than ' if size > remote.size else ''}{size} "
                        f"bytes, expected {remote.size}; {fix}")
    return digest.hexdigest()


# ------------------------------------------------------------------------ user files
