"""Task construction: `Task(...)` with positional arguments (how expand made tasks before
`new_task`) against `new_task(...)` with keywords (how every site makes them now). One process,
gc off, 20k tasks made and dropped a sample, the three loops alternated, min over ROUNDS rounds:

    PYTHONPATH=. python bench/task_factory.py 1500
"""

import gc
import sys
import time
from collections.abc import Callable

from runner.tasks import Task, new_task

N = 20_000
KEYS = [f"{i:064x}" for i in range(N)]
BODY = b"x" * 800


def positional() -> None:
    for key in KEYS:
        Task(key, "summeval", "item-1", "stars", "coherence", "fake", 0, BODY, 300, 256, ())


def keywords() -> None:
    for key in KEYS:
        new_task(key=key, dataset="summeval", item_id="item-1", prompt="stars",
                 aspect="coherence", model="fake", sample=0, body=BODY, prompt_tokens=300,
                 max_tokens=256, members=())


def loop_alone() -> None:
    for _ in KEYS:
        pass


def main(rounds: int) -> None:
    gc.disable()
    loops: list[tuple[str, Callable[[], None]]] = [
        ("Task(...)", positional), ("new_task(...)", keywords), ("loop", loop_alone)]
    best = dict.fromkeys((name for name, _ in loops), float("inf"))
    for r in range(rounds):
        for name, loop in loops if r % 2 == 0 else loops[::-1]:
            started = time.perf_counter()
            loop()
            best[name] = min(best[name], time.perf_counter() - started)
    ns = {name: seconds / N * 1e9 for name, seconds in best.items()}
    print(", ".join(f"{name} {value:.0f} ns/task" for name, value in ns.items())
          + f"; new_task/Task {ns['new_task(...)'] / ns['Task(...)']:.3f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1500)
