"""Automatic metrics of one generated answer: BLEU, chrF, ROUGE and token-overlap precision,
recall and F1 against its reference, and Distinct-n of the answer alone (the metrics of
ColossalAI's automatic evaluation, without BERTScore, which needs a model download).

Pure functions of text. Tokenization depends on `language`:

- "en": lowercase, runs of [a-z0-9] are the tokens (rouge-score's own default tokenizer).
- "zh": the same ASCII runs, plus every other word character (each Chinese character) as a
  token of its own: Chinese has no spaces, and whitespace splitting would make a whole
  sentence one token. ColossalAI segments Chinese with jieba instead; characters need no
  dictionary and are the usual choice for Chinese BLEU and ROUGE.

BLEU uses sacrebleu's own tokenizer ("13a", or "zh" which splits Chinese characters) and
chrF works on characters in both languages; both are on sacrebleu's 0-100 scale, the others
on 0-1. ROUGE is the F-measure of rouge-score (rouge1, rouge2, rougeL), fed our tokens.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from types import SimpleNamespace
from typing import Any

__all__ = ["LANGUAGES", "METRICS", "NEEDS_REFERENCE", "bleu", "chrf", "compute", "distinct",
           "overlap", "rouge", "tokens"]

METRICS: Mapping[str, tuple[str, ...]] = {
    "bleu": ("bleu",),
    "chrf": ("chrf",),
    "rouge": ("rouge1", "rouge2", "rougeL"),
    "distinct": ("distinct_1", "distinct_2"),
    "overlap": ("precision", "recall", "f1"),
}
"""Metric name (as a job lists it) -> the columns it yields."""
NEEDS_REFERENCE = frozenset({"bleu", "chrf", "rouge", "overlap"})
"""Metrics left out (no column value) when the item has no reference text."""
LANGUAGES = ("en", "zh")

_EN_TOKEN = re.compile(r"[a-z0-9]+")
# An ASCII word, or any single other word character (a Chinese character, a kana, ...).
_ZH_TOKEN = re.compile(r"[a-z0-9]+|[^\W_a-z0-9]")


def tokens(text: str, language: str) -> list[str]:
    """The tokens ROUGE, Distinct and overlap count (see the module docstring).

    Args:
        text: any text.
        language: "en" or "zh" (anything but "zh" tokenizes as "en").

    Returns:
        The lowercased tokens in order.
    """
    pattern = _ZH_TOKEN if language == "zh" else _EN_TOKEN
    return pattern.findall(text.lower())


def bleu(hypothesis: str, reference: str, language: str) -> float:
    """Sentence BLEU (sacrebleu defaults: 4-grams, exp smoothing).

    Args:
        hypothesis, reference: the generated answer and its reference text.
        language: "zh" for sacrebleu's Chinese tokenizer, else "13a".

    Returns:
        BLEU on 0-100.
    """
    import sacrebleu

    tokenize = "zh" if language == "zh" else "13a"
    return float(sacrebleu.sentence_bleu(hypothesis, [reference], tokenize=tokenize).score)


def chrf(hypothesis: str, reference: str) -> float:
    """Sentence chrF (sacrebleu defaults: character 6-grams, beta 2), in any language.

    Args:
        hypothesis, reference: the generated answer and its reference text.

    Returns:
        chrF on 0-100.
    """
    import sacrebleu

    return float(sacrebleu.sentence_chrf(hypothesis, [reference]).score)


# sacrebleu and rouge-score are imported where a metric is computed, not with this module:
# rouge-score pulls in nltk (~1.5 s and ~100 MB at start-up), and most commands of most jobs
# compute no metric.


@functools.lru_cache(maxsize=4)
def _scorer(language: str) -> Any:
    from rouge_score import rouge_scorer

    # our tokens: rouge-score only calls its tokenizer's `tokenize`
    tokenizer = SimpleNamespace(tokenize=functools.partial(tokens, language=language))
    return rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], tokenizer=tokenizer)


def rouge(hypothesis: str, reference: str, language: str) -> dict[str, float]:
    """ROUGE-1, ROUGE-2 and ROUGE-L F-measures (rouge-score, our tokens, no stemming).

    Args:
        hypothesis, reference: the generated answer and its reference text.
        language: "en" or "zh", for `tokens`.

    Returns:
        {"rouge1": f, "rouge2": f, "rougeL": f}, each on 0-1.
    """
    scores = _scorer(language).score(reference, hypothesis)
    return {name: float(scores[name].fmeasure) for name in ("rouge1", "rouge2", "rougeL")}


def distinct(text: str, n: int, language: str) -> float:
    """Distinct-n: unique n-grams / all n-grams of the text.

    Args:
        text: the generated answer.
        n: the n-gram length.
        language: "en" or "zh", for `tokens`.

    Returns:
        The share on 0-1; 0.0 when the text has no n-gram.
    """
    words = tokens(text, language)
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def overlap(hypothesis: str, reference: str, language: str) -> dict[str, float]:
    """Token-overlap precision, recall and F1 (multiset intersection, as SQuAD's F1).

    Args:
        hypothesis, reference: the generated answer and its reference text.
        language: "en" or "zh", for `tokens`.

    Returns:
        {"precision": p, "recall": r, "f1": f}, each on 0-1; all 0.0 with no common token.
    """
    hyp, ref = tokens(hypothesis, language), tokens(reference, language)
    common = sum((Counter(hyp) & Counter(ref)).values())
    if common == 0:
        return {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    precision, recall = common / len(hyp), common / len(ref)
    return {"precision": precision, "recall": recall,
            "f1": 2 * precision * recall / (precision + recall)}


def compute(names: Iterable[str], hypothesis: str, reference: str,
            language: str) -> dict[str, float]:
    """The listed metrics of one answer, by column.

    Reference-based metrics (`NEEDS_REFERENCE`) are left out when the reference is empty (or
    only whitespace); Distinct never needs one.

    Args:
        names: metric names as a job lists them (keys of `METRICS`).
        hypothesis, reference: the generated answer and its reference text ("" when none).
        language: "en" or "zh", for `tokens`.

    Returns:
        Column -> value, the columns of `METRICS` for each metric computed.

    Raises:
        ValueError: a name is not a metric (the job loader lets none through).
    """
    out: dict[str, float] = {}
    has_reference = bool(reference.strip())
    for name in names:
        if name in NEEDS_REFERENCE and not has_reference:
            continue
        if name == "bleu":
            out["bleu"] = bleu(hypothesis, reference, language)
        elif name == "chrf":
            out["chrf"] = chrf(hypothesis, reference)
        elif name == "rouge":
            out.update(rouge(hypothesis, reference, language))
        elif name == "distinct":
            out["distinct_1"] = distinct(hypothesis, 1, language)
            out["distinct_2"] = distinct(hypothesis, 2, language)
        elif name == "overlap":
            out.update(overlap(hypothesis, reference, language))
        else:
            raise ValueError(f"unknown metric {name!r}; known: {', '.join(METRICS)}")
    return out
