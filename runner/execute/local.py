"""The offline default judge: llama.cpp's OpenAI-compatible server on 127.0.0.1, which never
outlives the process that started it.

A model spec `local:NAME` names a GGUF file shipped inside a PyPI package (see
runner.execute.localmodels). `LocalServer` runs `python -m llama_cpp.server` for it on a free
loopback port, so the rest of the pipeline talks to it like any other OpenAI-compatible endpoint:

```
with LocalServer("smollm2") as srv:
    srv.base_url  # "http://127.0.0.1:PORT/v1"
    srv.model     # "smollm2", the model name to send
```

The server never outlives us: it is stopped on exit, on exceptions and on Ctrl-C, and on
Linux the kernel kills it when the parent dies, even by `kill -9` (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

from runner.errors import ConfigError
from runner.execute.localmodels import LOCAL_PREFIX, model_path, require_server

__all__ = ["LocalServer"]

# llama_cpp.server reads its settings from environment variables too (pydantic-settings,
# case-insensitive, no prefix), and HOST, PORT and CONFIG_FILE override the command line.
# An API_KEY, PORT or MODEL in the user's shell must not reconfigure our server, so the child
# gets the environment without these names (the settings fields of llama-cpp-python 0.3.x).
_SERVER_ENV_NAMES = frozenset({
    "api_key", "cache", "cache_size", "cache_type", "chat_format", "chat_template_kwargs",
    "clip_model_path", "config_file", "disable_ping_events", "draft_model",
    "draft_model_num_pred_tokens", "embedding", "flash_attn", "hf_model_repo_id",
    "hf_pretrained_model_name_or_path", "hf_tokenizer_config_path", "host",
    "interrupt_requests", "kv_overrides", "last_n_tokens_size", "logits_all", "lora_base",
    "lora_path", "main_gpu", "model", "model_alias", "models", "mul_mat_q", "n_batch", "n_ctx",
    "n_gpu_layers", "n_threads", "n_threads_batch", "n_ubatch", "numa", "offload_kqv", "port",
    "root_path", "rope_freq_base", "rope_freq_scale", "rope_scaling_type", "rpc_servers", "seed",
    "split_mode", "ssl_certfile", "ssl_keyfile", "tensor_split", "type_k", "type_v",
    "use_mlock", "use_mmap", "verbose", "vocab_only", "yarn_attn_factor", "yarn_beta_fast",
    "yarn_beta_slow", "yarn_ext_factor", "yarn_orig_ctx",
})

_PR_SET_PDEATHSIG = 1
_BIND_ATTEMPTS = 3  # a free port can be taken between our probe and the server's bind
CACHE_BYTES = 256 << 20
"""The prompt cache's capacity; one saved state of a ~200-token prompt is ~5 MB for smollm2,
and the least recently used are dropped first."""
STARTUP_TIMEOUT_S = 60.0  # for GET /v1/models to answer
STOP_TIMEOUT_S = 5.0  # after SIGTERM, before SIGKILL


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _child_env(env: Mapping[str, str]) -> dict[str, str]:
    clean = {k: v for k, v in env.items() if k.lower() not in _SERVER_ENV_NAMES}
    clean["PYTHONUNBUFFERED"] = "1"  # so the log's tail is complete when the server dies
    return clean


def _death_signal_setter() -> Callable[[], None] | None:
    """A preexec_fn that asks Linux to SIGKILL the child when its parent dies, else None.

    prctl is resolved here, in the parent, so the child between fork and exec only makes the
    one call. The getppid check closes the race where the parent died before the prctl.
    """
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # here, where it is used: not at every command's start-up

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def set_death_signal() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return set_death_signal


def _tail(path: Path, lines: int = 20) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - 8192))
            text = f.read().decode("utf-8", "replace")
    except OSError as e:
        return f"(cannot read {path}: {e})"
    return "\n".join(text.splitlines()[-lines:]) or "(empty)"


class LocalServer:
    """llama.cpp's OpenAI-compatible server for one local model, as a context manager.

    Args:
        name: a key of `LOCAL_MODELS` (the part after `local:`).
        prompt_cache: turn on llama.cpp's RAM prompt cache (`--cache True --cache_type ram`),
            which restores the saved state with the longest common prefix. Off by default:
            without it llama.cpp already keeps the previous request's KV cache and reuses its
            common prefix (the ~127-token system + instruction prefix of the OpenMEVA star
            prompt), and measured on 2 cores the cache saved ~14 more prompt tokens per call
            but gave no net speed-up, since each hit restores a state and rescans the logits.
        n_ctx: context size in tokens; the OpenMEVA star prompt with a story is 178-223
            tokens in the chat template, so 2048 leaves room for longer stories and replies.
        n_threads: threads for generation and for prompt processing.
        log_path: where the server's stdout and stderr go; None makes a temp file, kept
            after exit (see `log_path`).

    Start it from a thread that lives as long as the server (normally the main thread):
    on Linux the death signal fires when the *thread* that started the child exits.
    """

    def __init__(
        self,
        name: str,
        *,
        prompt_cache: bool = False,
        n_ctx: int = 2048,
        n_threads: int = 2,
        log_path: str | os.PathLike[str] | None = None,
    ) -> None:
        """Set up the server; it starts on `__enter__`. Args: as the class's."""
        self.name = name
        self.model = name
        self.prompt_cache = prompt_cache
        self.n_ctx = n_ctx
        self.n_threads = n_threads
        self.log_path: Path | None = Path(log_path) if log_path is not None else None
        self.port = 0
        self.startup_seconds = 0.0
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def spec(self) -> str:
        """The model spec, `local:NAME`, for messages."""
        return LOCAL_PREFIX + self.name

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, e.g. `http://127.0.0.1:PORT/v1`."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs."""
        return self._proc.pid if self._proc is not None else None

    def command(self, path: Path, port: int) -> list[str]:
        """The server's command line.

        Args:
            path: the model's .gguf file.
            port: the loopback port to listen on.

        Returns:
            The argv of `python -m llama_cpp.server` with this server's settings.
        """
        return [
            sys.executable, "-m", "llama_cpp.server",
            "--model", str(path), "--model_alias", self.name,
            "--host", "127.0.0.1", "--port", str(port),
            "--n_ctx", str(self.n_ctx),
            "--n_threads", str(self.n_threads), "--n_threads_batch", str(self.n_threads),
            # The server defaults to logits for every prompt token; we never ask for them,
            # and they make each prompt-cache save copy n_tokens x 49k floats.
            "--logits_all", "False",
            "--cache", str(self.prompt_cache), "--cache_type", "ram",
            "--cache_size", str(CACHE_BYTES),
            "--verbose", "False",
        ]

    def __enter__(self) -> LocalServer:
        path = model_path(self.name)
        require_server(self.name)
        if self.log_path is None:
            fd, log_name = tempfile.mkstemp(prefix=f"judge-local-{self.name}-", suffix=".log")
            os.close(fd)
            self.log_path = Path(log_name)
        started = time.monotonic()
        try:
            for attempt in range(_BIND_ATTEMPTS):
                if self._start(path, last_attempt=attempt == _BIND_ATTEMPTS - 1):
                    break
        except BaseException:
            self._stop()
            raise
        self.startup_seconds = time.monotonic() - started
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()

    def _start(self, path: Path, *, last_attempt: bool) -> bool:
        """Start the server on a fresh port; False if that port was taken meanwhile."""
        assert self.log_path is not None
        self.port = _free_port()
        try:
            log: IO[bytes] = self.log_path.open("wb")
        except OSError as e:
            raise ConfigError(
                f"{self.spec}: cannot write the server log {self.log_path}: {e}"
            ) from e
        with log:  # the child holds its own descriptor
            self._proc = subprocess.Popen(
                self.command(path, self.port),
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=_child_env(os.environ),
                # Our own session: a Ctrl-C in the terminal reaches only us, so in-flight
                # requests can finish during a graceful shutdown; we stop the server after.
                start_new_session=True,
                preexec_fn=_death_signal_setter(),
            )
        rc = self._wait_ready()
        if rc is None:
            return True
        self._proc = None
        tail = _tail(self.log_path)
        if not last_attempt and "address already in use" in tail.lower():
            return False
        raise ConfigError(
            f"{self.spec}: the llama.cpp server exited with code {rc} before answering on "
            f"{self.base_url}; last lines of {self.log_path}:\n{tail}"
        )

    def _wait_ready(self) -> int | None:
        """Poll GET /v1/models until it answers (None) or the server exits (its code)."""
        assert self._proc is not None
        import urllib.request  # here, where it is used: not at every command's start-up

        # No proxies: an http_proxy in the environment must not see loopback requests.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        pause = 0.05
        while True:
            rc = self._proc.poll()
            if rc is not None:
                return rc
            with contextlib.suppress(OSError):  # refused, reset, or HTTP 5xx while loading
                with opener.open(self.base_url + "/models", timeout=2.0) as resp:
                    if resp.status == 200:
                        return None
            if time.monotonic() > deadline:
                assert self.log_path is not None
                raise ConfigError(
                    f"{self.spec}: the llama.cpp server did not answer GET {self.base_url}"
                    f"/models within {STARTUP_TIMEOUT_S:g} s; last lines of "
                    f"{self.log_path}:\n{_tail(self.log_path)}"
                )
            time.sleep(pause)
            pause = min(pause * 2, 0.5)

    def _stop(self) -> None:
        """SIGTERM, then SIGKILL after STOP_TIMEOUT_S; a second Ctrl-C here still kills it."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=1.0)
