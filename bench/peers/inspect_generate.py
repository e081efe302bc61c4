"""inspect_ai's generate loop over the peers benchmark's requests (bench/peers.py).

Runs in the peers venv. Reads the same JSONL of chat-completion request bodies the other tools
get, makes one inspect `Sample` per request (the same messages; temperature and max_tokens from
the request as the task's GenerateConfig), and runs `inspect_ai.eval` with the `generate()`
solver and no scorer, model `openai/<model>` at `--base-url`, `max_connections` =
`--concurrency`. Everything else is inspect's default: the model cache off (generate()'s
default), the eval log written to `--log-dir` in the default `.eval` format with every
sample (log_samples), adaptive connections overridden by the explicit max_connections. The
display is "none" (no terminal UI to draw). Prints one JSON object: the seconds from reading
the first request to eval() returning (its log written), the sample counts and the log's size.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from inspect_ai import Task, eval
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.model import ChatMessageUser, GenerateConfig
from inspect_ai.solver import generate


def _samples(path: Path) -> tuple[list[Sample], dict[str, Any]]:
    samples, first = [], None
    with path.open(encoding="utf-8") as f:
        for i, line in enumerate(f):
            body = json.loads(line)
            first = first or body
            messages = [ChatMessageUser(content=m["content"]) for m in body["messages"]]
            samples.append(Sample(id=i, input=messages))
    assert first is not None, f"{path} has no requests"
    return samples, first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=Path, required=True)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--log-dir", required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--time-limit-s", type=int, default=300,
                        help="inspect's per-sample time limit")
    args = parser.parse_args()
    started = time.perf_counter()
    samples, first = _samples(args.requests)
    task = Task(dataset=MemoryDataset(samples), solver=generate(), scorer=None,
                config=GenerateConfig(temperature=first.get("temperature"),
                                      max_tokens=first.get("max_tokens")))
    # responses_api=False: inspect treats an unknown model name as a frontier OpenAI model and
    # would call /v1/responses; an OpenAI-compatible server is called on chat completions.
    logs = eval(task, model=f"openai/{first['model']}", model_base_url=args.base_url,
                model_args={"responses_api": False},
                max_connections=args.concurrency, max_retries=2, timeout=60,
                time_limit=args.time_limit_s, display="none", log_dir=args.log_dir)
    seconds = time.perf_counter() - started
    log = logs[0]
    done = [s for s in (log.samples or []) if s.output.completion and s.error is None]
    log_bytes = sum(p.stat().st_size for p in Path(args.log_dir).rglob("*") if p.is_file())
    json.dump({"seconds": seconds, "status": log.status, "samples": len(log.samples or []),
               "answered": len(done), "log_bytes": log_bytes,
               "first_answer": done[0].output.completion if done else None}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
