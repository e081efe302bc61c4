"""A judge for the billing bench (bench/billing.py) that agrees with the humans as the papers'
judges did, so that `--until-ci` is tried on CIs as wide as a real study's, not a noise judge's.

tests/fakeserver.default_reply answers a hash of the request: its correlation with the humans is
about 0, the widest CIs there are. `replies(job, limit)` instead answers each request the bench
will send (found by its last user message, the text that names the items) with:

- Lai et al. formality (`per = "group"`, parser `outputs`): the paper's own ChatGPT answers,
  recorded in the data set (metrics `chatgpt` for the `single` prompt, `chatgpt_multi` for
  `multi`; laihuiyuan/eval-formality-transfer, chatgpt/*.json), one per output: the real judge.
- G-Eval on SummEval (no GPT-4 answers in the data set): the summary's expert mean, rescaled to
  the prompt's scale (1-5; fluency 1-3), plus Gaussian noise of SIGMA (seeded by the request's
  hash: the same request, the same answer), rounded and clipped to the scale. SIGMA is set so
  the summary-level Spearman over all 1,600 items matches G-Eval-4's in Liu et al. 2023,
  Table 1 (coherence 0.582, consistency 0.507, fluency 0.455, relevance 0.547);
  bench/README.md gives the figures each run measured.

Only the answer's text changes: the fakes bill output tokens per request, not per character
(tests/fakeproviders.py: 7 for a Messages answer, 3 x n for a chat completion).
"""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from runner.data.datasets import Item
from runner.job.load import load_job
from runner.prepare import prepare

SUMMEVAL_HUMAN = (1.0, 5.0)  # the expert means' range
GEVAL_SCALE = {"coherence": 5, "consistency": 5, "fluency": 3, "relevance": 5}  # 1..max
# G-Eval-4's summary-level Spearman with the experts (Liu et al. 2023, Table 1), and the noise
# (in points of the prompt's scale) that gives it on all 1,600 summaries (0.577, 0.507, 0.456,
# 0.545 averaged over three seeds; tests/test_fakebilling.py checks within 0.04)
GEVAL4_SPEARMAN = {"coherence": 0.582, "consistency": 0.507, "fluency": 0.455, "relevance": 0.547}
SIGMA = {"coherence": 1.25, "consistency": 0.95, "fluency": 0.48, "relevance": 0.88}
RECORDED = {"single": "chatgpt", "multi": "chatgpt_multi"}  # Lai et al.'s ChatGPT, by prompt


def geval_score(item: Item, aspect: str, seed: bytes) -> int:
    """G-Eval's answer for one summary: its expert mean on the prompt's scale, plus noise.

    Args:
        item: the summary; aspect: the prompt's; seed: the request's text.

    Returns:
        An integer in 1..GEVAL_SCALE[aspect].
    """
    top, (low, high) = GEVAL_SCALE[aspect], SUMMEVAL_HUMAN
    scaled = 1 + (item.human[aspect] - low) / (high - low) * (top - 1)
    noise = random.Random(hashlib.sha256(seed).digest()).gauss(0.0, SIGMA[aspect])
    return min(top, max(1, round(scaled + noise)))


def _text(body: dict[str, Any]) -> str:
    """The last user message's text (the fake hands Messages bodies over flattened)."""
    return str(next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user"))


def replies(job_path: Path, limit: int | None) -> Callable[[dict[str, Any]], str]:
    """The answers to every request of a bench job, for `Fake(reply=...)`.

    Args:
        job_path: the bench's variant of the study's job; limit: its --limit.

    Returns:
        body -> answer text; a request the job does not send raises KeyError (a 500).
    """
    expansion = prepare(load_job(job_path), Path(os.environ["JUDGE_DATA_DIR"]), limit=limit)
    answers: dict[str, str] = {}
    scores: dict[str, dict[str, list[float]]] = {}  # group request -> aspect -> per output
    for task in expansion.tasks():
        text = _text(orjson.loads(task.body))
        if not task.members:
            item = expansion.index[(task.dataset, task.item_id)]
            answers[text] = str(geval_score(item, task.aspect, text.encode()))
            continue
        scores.setdefault(text, {})[task.aspect] = [
            expansion.index[(task.dataset, m)].metrics[task.aspect][RECORDED[task.prompt]]
            for m in task.members]
    for text, by_aspect in scores.items():
        answers[text] = "\n".join(
            f"Output {n + 1}\nScore: {next(iter(by_aspect.values()))[n]:g}\n" + "".join(
                f"{aspect.title()}: {values[n]:g}\n" for aspect, values in by_aspect.items()) +
            "Explanation: as recorded" for n in range(len(next(iter(by_aspect.values())))))
    return lambda body: answers[_text(body)]
