"""Write the ColossalAI chat-evaluation prompts as static templates under prompts/colossalai/.

Source: hpcaitech/ColossalAI applications/Chat/evaluate @ 079bf3c (Sep 2023), the last version
of the Chat evaluation, read from $JUDGE_DATA_DIR/colossalai_chat_eval/chat_evaluate_2023-09/
(sha256-checked). ColossalEval's copies (registered with colossalai_en/cn) hold the same text for
their five categories, ids aside, and lack classification, closed_qa, extraction, rewriting and
summarization, so the 2023-09 files are the one source used.

For every category of config_{en,cn}.json that has a prompt in evaluation_prompt_{en,cn}.json,
and every GPT metric the config gives it, `prompt` is filled the way gpt_evaluate.py does
(`str.format`) with metric = metrics[metric] and steps = CoT[metric] taken verbatim; question
and answer become the runner's {{question}} and {{answer}} placeholders:

  {lang}/{category}/{metric}.txt            the plain prompt (metric: spaces -> "_")
  {lang}/{category}/{metric}_reference.txt  the same + the reference block of
                                            --gpt_with_reference ({{reference}})
  {lang}/battle_system.txt, battle.txt      the battle prompt ({{question}}, {{output_1/2}})
  answer.txt                                what the candidates are asked: {{question}}

Files are written byte for byte (no trailing newline added). Categories without a prompt
(logical_reasoning and the domain categories, which ColossalAI sends to "general") are left out.

Usage:  python tools/colossalai_prompts.py [--check] [--toml en|cn]
  --check  compare the files on disk with what would be written; exit 1 on any difference
  --toml   print the job-file tables (templates, metrics) for one language
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "prompts" / "colossalai"
SOURCE = "colossalai_chat_eval/chat_evaluate_2023-09/applications/Chat/evaluate"
SHA256 = {
    "config/config_cn.json":
        "59792212ad5129a5d69517d05f51f37c228529ecdd306261f4b75ad40637a035",
    "config/config_en.json":
        "daecb95ed508157e0ca421434b8327d0d3c0acc3780206ec312fe96967bcd64a",
    "prompt/battle_prompt/battle_prompt_cn.json":
        "7fde0c44c17843e2a7b80f15ce59ccb5f5630bd53acb8642f2f5e87aec95d143",
    "prompt/battle_prompt/battle_prompt_en.json":
        "86d7e73693bd358e37b439ba13899e1ac5e3646fcb02f91ecf6929e558ea5956",
    "prompt/evaluation_prompt/evaluation_prompt_cn.json":
        "8a32e8b5576404e032c1c40f4a1a61aeb88704f2a7296b4f89625d73f5a227c9",
    "prompt/evaluation_prompt/evaluation_prompt_en.json":
        "749463c14e0522a7a3a29aea0487778fb7af6c83a6e063ab9455ca1a185864ff",
}

# gpt_evaluate.py @ 079bf3c, ref_step_template / ref_answer_template_* / reference_template():
# the second user turn of --gpt_with_reference, in each language.
REF_STEP = {
    "en": "Now please compare the answer with the {adjective} answer, determine whether the "
          "answer is able to achieve the same level of {metric}.\n\n",
    "cn": "请比较答案与上面的{adjective}答案，"
          "确定答案是否可以达到与该{adjective}答案同样水平的{metric}。\n\n",
}
REF_ANSWER_GENERAL = {"en": "\nAn example answer with good quality is as follows:\n\n{answer}\n\n",
                      "cn": "\n一个优质的示例答案如下：\n\n{answer}\n\n"}
REF_ANSWER_CORRECTNESS = {"en": "\nA correct answer is as follows:\n\n{answer}\n\n",
                          "cn": "\n标准答案如下：\n\n{answer}\n\n"}
FOR_THE_GIVEN_ANSWER = {"en": "{metric} (1-5) (directly give the score for the given answer):",
                        "cn": "{metric} (1-5) (直接对给定答案打分)"}
# ColossalAI's automatic metric names -> runner.parse.metrics names (BERTScore needs a model:
# left out).
METRICS = {"BLEU": "bleu", "ROUGE": "rouge", "Distinct": "distinct", "CHRF": "chrf",
           "Precision": "overlap", "Recall": "overlap", "F1 score": "overlap"}


def data_dir() -> Path:
    return Path(os.environ.get("JUDGE_DATA_DIR")
                or Path.home() / ".cache" / "judge-runner" / "data")


def load(name: str, lang: str) -> Any:
    rel = name.format(lang=lang)
    path = data_dir() / SOURCE / rel
    raw = path.read_bytes()
    if hashlib.sha256(raw).hexdigest() != SHA256[rel]:
        sys.exit(f"{path}: sha256 differs from ColossalAI @ 079bf3c; re-fetch the file")
    return json.loads(raw)


def slug(metric: str) -> str:
    return metric.replace(" ", "_")


def reference_block(metric: str, lang: str) -> str:
    """gpt_evaluate.reference_template(), with the reference text as {{reference}}."""
    adjective, answer = ("example" if lang == "en" else "示例"), REF_ANSWER_GENERAL[lang]
    if metric.lower() == "correctness":
        adjective, answer = ("correct" if lang == "en" else "标准"), REF_ANSWER_CORRECTNESS[lang]
    step = REF_STEP[lang].format(metric=metric.lower(), adjective=adjective)
    return (answer.format(answer="{{reference}}") + step
            + FOR_THE_GIVEN_ANSWER[lang].format(metric=metric))


def metric_prompt(entry: dict[str, Any], metric: str) -> str:
    """gpt_evaluate's prompt_1st_round with the runner's placeholders."""
    return str(entry["prompt"]).format(question="{{question}}", answer="{{answer}}",
                                       metric=entry["metrics"][metric],
                                       steps=entry["CoT"][metric])


def files(lang: str) -> dict[str, str]:
    """Relative path under prompts/colossalai/ -> text, for one language."""
    config = load("config/config_{lang}.json", lang)["category"]
    prompts = load("prompt/evaluation_prompt/evaluation_prompt_{lang}.json", lang)
    battle = load("prompt/battle_prompt/battle_prompt_{lang}.json", lang)
    out = {"answer.txt": "{{question}}",
           f"{lang}/battle_system.txt": battle["system_prompt"],
           f"{lang}/battle.txt": battle["prompt_template"].format(
               question="{{question}}", answer_1="{{output_1}}", answer_2="{{output_2}}",
               prompt=battle["prompt"])}
    for category, settings in config.items():
        if category not in prompts:
            continue
        for metric in settings["GPT"]:
            first = metric_prompt(prompts[category], metric)
            out[f"{lang}/{category}/{slug(metric)}.txt"] = first
            out[f"{lang}/{category}/{slug(metric)}_reference.txt"] = (
                first + reference_block(metric, lang))
    return out


def toml(lang: str) -> str:
    """The job-file tables for one language: both prompts' templates, the metrics table."""
    config = load("config/config_{lang}.json", lang)["category"]
    prompts = load("prompt/evaluation_prompt/evaluation_prompt_{lang}.json", lang)
    keys = [(c, slug(m)) for c, s in config.items() if c in prompts for m in s["GPT"]]
    aspects = list(dict.fromkeys(m for _, m in keys))
    lines = [f"aspects = {json.dumps(aspects)}", ""]
    for suffix in ("", "_reference"):
        lines.append("[prompts.template]")
        lines += [f'"{m}@{c}" = "../prompts/colossalai/{lang}/{c}/{m}{suffix}.txt"'
                  for c, m in keys]
        lines.append("")
    lines.append("[generate.metrics]")
    for category, settings in config.items():
        names = list(dict.fromkeys(METRICS[n] for n in settings.get("Metrics", [])
                                   if n in METRICS))
        if names:
            lines.append(f"{category} = {json.dumps(names)}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--toml", choices=("en", "cn"))
    args = parser.parse_args()
    if args.toml:
        print(toml(args.toml))
        return
    wanted = {**files("en"), **files("cn")}
    stale = []
    for rel, text in wanted.items():
        path = OUT / rel
        if args.check:
            if not path.exists() or path.read_bytes() != text.encode("utf-8"):
                stale.append(rel)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text.encode("utf-8"))
    if stale:
        sys.exit(f"{len(stale)} files differ from the published prompts, e.g. {stale[0]}; "
                 "run python tools/colossalai_prompts.py")
    print(f"{len(wanted)} files {'checked' if args.check else 'written'} under {OUT}")


if __name__ == "__main__":
    main()
