"""A judge model from the job file (`[models.NAME]`) or the command line (`--model SPEC`): its
spec string parsed, its URLs checked, its price, mode and fleet read into a ModelSpec.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from runner.errors import ConfigError, redact_url
from runner.job.bill import Price
from runner.job.providers import KINDS
from runner.job.reader import Reader, check_params
from runner.job.spec import EndpointSpec, ModelSpec

__all__ = ["parse_model_spec", "read_model", "url_problem"]

# The spec prefixes (`anthropic:NAME`), each its provider table row; a bare name is "compatible".
_PREFIXES = {r.prefix: r for r in KINDS.values() if r.prefix is not None}
AZURE_API_VERSION = "2024-10-21"


def parse_model_spec(spec: str, *, name: str | None = None, base_url: str | None = None,
                     api_key_env: str | None = None, **extra: Any) -> ModelSpec:
    """Turn `openai:NAME`, `anthropic:NAME`, `gemini:NAME`, `azure:DEPLOYMENT`, `local:NAME`
    or a bare `NAME` into a ModelSpec.

    A bare name needs `base_url` (from the job, `--base-url` or `OPENAI_BASE_URL`); a key is
    sent if one is set. The provider prefixes always need a key (in their preset variable
    unless `api_key_env` names another); azure also needs `base_url`, the resource URL.

    Args:
        spec: the model spec as written in the job file or on the command line.
        name: the judge's name in reports; defaults to `spec`.
        base_url: the endpoint; defaults to the provider's preset.
        api_key_env: the variable holding the key; defaults to the provider's preset or
            OPENAI_API_KEY.
        **extra: further `ModelSpec` fields (rpm, params, endpoints, ...).

    Returns:
        The ModelSpec, of its prefix's kind in the provider table ("compatible" for a bare name).

    Raises:
        ConfigError: the spec names no model, or azure has no `base_url`.
    """
    prefix, _, rest = spec.partition(":")
    preset = _PREFIXES.get(prefix)
    if preset is not None and not rest.strip():
        raise ConfigError(f"model spec {spec!r} names no model: use {prefix}:NAME, e.g. "
                          "openai:gpt-4o-mini or local:smollm2")
    if preset is not None and preset.kind == "local":
        return ModelSpec(name=name or spec, spec=spec, model=rest, kind="local", base_url=None,
                         api_key_env=api_key_env or preset.key_env, **extra)
    if preset is not None:
        url = base_url or preset.base_url
        if url is None and not extra.get("endpoints"):
            raise ConfigError(f"model spec {spec!r} needs base_url = your resource URL, "
                              "e.g. https://NAME.openai.azure.com")
        if preset.kind == "azure":
            extra.setdefault("api_version", AZURE_API_VERSION)
        return ModelSpec(name=name or spec, spec=spec, model=rest, kind=preset.kind,
                         base_url=url, api_key_env=api_key_env or preset.key_env,
                         key_required=preset.key_required, **extra)
    if not spec.strip():
        raise ConfigError("model spec is empty: use openai:NAME, local:NAME or a model name")
    return ModelSpec(name=name or spec, spec=spec, model=spec, kind="compatible",
                     base_url=base_url, api_key_env=api_key_env or "OPENAI_API_KEY", **extra)


def url_problem(url: str) -> str | None:
    """What is wrong with an endpoint URL (`htp://`, `http//x`, no host, a bad port, a
    `user:password@` in it).

    Checked when the job is read, not retried as a connection error on every task; aiohttp
    refuses a user and password beside the key's Authorization header. The message shows the
    URL without its password.

    Args:
        url: the URL as written.

    Returns:
        A message naming the URL and the fix, or None when it is an http(s) URL with a host.
    """
    shown = redact_url(url)
    try:
        parts = urlsplit(url)
        port_ok = parts.port is None or 0 < parts.port < 65536
    except ValueError:
        return f"{shown!r} is not an http(s) URL (bad port or address)"
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        return f"{shown!r} is not an http(s) URL; write it like http://127.0.0.1:8000/v1"
    if parts.username is not None or parts.password is not None:
        return (f"{shown!r} has credentials in it (user:password@), which are never sent: "
                "remove them and put the key in the model's api_key_env variable "
                "(OPENAI_API_KEY unless the job names another); it goes in the provider's header")
    return None


def read_model(r: Reader, key: str, table: Any) -> ModelSpec:
    """One `[models.NAME]` table.

    Args:
        r: the reader of `[models]`; key: NAME, the judge's name; table: the table.

    Returns:
        The ModelSpec.

    Raises:
        ConfigError: a wrong key or value, naming its key path.
    """
    if not isinstance(table, dict):
        raise r.error(key, "must be a table like [models.judge] with spec = \"...\"")
    m = r.child(key, table)
    m.check_keys({"spec", "base_url", "api_key_env", "params", "rpm", "tpm", "price", "mode",
                  "batch_discount", "endpoints", "api_version"})
    price = _price(m)
    params = m.get("params", dict, {})
    check_params(m, params)
    spec = m.get("spec", str, required=True)
    url = m.get("base_url", str)
    if url is not None and (problem := url_problem(url)):
        raise m.error("base_url", problem)
    fleet = _endpoints(m, spec)
    key_env = m.get("api_key_env", str)
    if fleet:  # the fleet's first replica stands for the model where the table names none
        url, key_env = url or fleet[0].base_url, key_env or fleet[0].api_key_env
    more: dict[str, Any] = {"endpoints": fleet} if fleet else {}
    if "api_version" in table:
        more["api_version"] = m.get("api_version", str)
    # read before the try: their errors already name their key; only the spec's get wrapped
    more.update(_batch_options(m), rpm=m.positive("rpm", None, float),
                tpm=m.positive("tpm", None, float))
    try:
        return parse_model_spec(spec, name=key, base_url=url, api_key_env=key_env, params=params,
                                price=price, **more)
    except ConfigError as exc:
        raise m.error("spec", str(exc)) from None


def _price(m: Reader) -> Price | None:
    """`price = {input = .., output = .., cached_input = .., cache_write = ..}` (USD per 1M
    tokens): the whole price of the model, in place of the provider table's; a cached input or
    cache write left out is billed as input."""
    if m.get("price", dict) is None:
        return None
    mp = m.child("price", m.table["price"])
    mp.check_keys({"input", "output", "cached_input", "cache_write"})
    got = {}
    for k in ("input", "output", "cached_input", "cache_write"):
        value = mp.get(k, (int, float), required=k in ("input", "output"))
        if value is not None and value < 0:
            raise mp.error(k, f"must be a price in USD per 1M tokens, 0 or more (got {value})")
        if value is not None:
            got[k] = float(value)
    return Price(**got)


def _batch_options(m: Reader) -> dict[str, Any]:
    """`mode = "online" | "batch"` and `batch_discount` (0 <= share saved < 1)."""
    mode = m.get("mode", str, "online")
    if mode not in ("online", "batch"):
        raise m.error("mode", f'must be "online" or "batch" (got {mode!r})')
    discount = m.get("batch_discount", (int, float))
    if discount is not None and not 0 <= discount < 1:
        raise m.error("batch_discount", "must be the share of the online price saved, from 0 "
                      f"up to (not including) 1, e.g. 0.5 (got {discount})")
    return {"mode": mode, "batch_discount": None if discount is None else float(discount)}


def _endpoints(m: Reader, spec: str) -> tuple[EndpointSpec, ...]:
    """`endpoints = [{base_url = ..., api_key_env = ..., rpm = ..., tpm = ...}, ...]`: the
    replicas of a fleet; each key variable defaults to the model's (or its provider's)."""
    entries = m.get("endpoints", list, [])
    if "endpoints" in m.table and not entries:
        raise m.error("endpoints", "is empty; list replicas, e.g. [{base_url = "
                      "\"http://10.0.0.1:8000/v1\"}, {base_url = \"http://10.0.0.2:8000/v1\"}]")
    if spec.startswith("local:") and entries:
        raise m.error("endpoints", "cannot serve a local: model; use a bare model name")
    prefix = spec.partition(":")[0]
    default_env = m.get("api_key_env", str) or (_PREFIXES[prefix].key_env if prefix in _PREFIXES
                                                else "OPENAI_API_KEY")
    out = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise m.error(f"endpoints[{i}]", "must be a table like {base_url = \"http://...\"}")
        e = m.child(f"endpoints[{i}]", entry)
        e.check_keys({"base_url", "api_key_env", "rpm", "tpm"})
        url = e.get("base_url", str, required=True)
        if (problem := url_problem(url)) is not None:
            raise e.error("base_url", problem)
        out.append(EndpointSpec(base_url=url.rstrip("/"),
                                api_key_env=e.get("api_key_env", str, default_env),
                                rpm=e.positive("rpm", None, float),
                                tpm=e.positive("tpm", None, float)))
    if len({(x.base_url, x.api_key_env) for x in out}) < len(out):  # two keys may share a URL
        raise m.error("endpoints", "lists the same base_url and api_key_env twice; remove one")
    return tuple(out)
