"""runner.data.seen.Seen against a Python set, with runs small enough to flush and merge often."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from runner.data.seen import Seen, key64
from runner.tasks import cache_key

values = st.lists(st.one_of(st.integers(0, 40), st.integers(0, 2**64 - 1),
                            st.sampled_from([0, 2**63 - 1, 2**63, 2**64 - 1])), max_size=400)


@settings(max_examples=300, deadline=None)
@given(values, st.integers(1, 9), st.integers(1, 40))
def test_add_and_contains_agree_with_a_set(added: list[int], recent: int, run: int) -> None:
    seen, model = Seen(recent=recent, run=run), set()
    for v in added:
        assert seen.add(v) == (v not in model)
        model.add(v)
        assert v in seen
    assert len(seen) == len(model)
    assert all(v in seen for v in model)
    for v in (1 << 62, 2**64 - 2, 41):  # values the strategy rarely makes
        assert (v in seen) == (v in model)


def test_a_million_members_stay_exact_and_small() -> None:
    rng = random.Random(7)
    members = [rng.getrandbits(64) for _ in range(300_000)]
    seen = Seen()
    assert all(seen.add(v) for v in members)
    assert not any(seen.add(v) for v in members[::997])  # repeats are spotted, in the runs too
    absent = [rng.getrandbits(64) for _ in range(20_000)]
    assert sum(v in seen for v in absent) == len(set(absent) & set(members))
    assert len(seen) == 300_000
    held = sum(r.nbytes for r in seen._runs) + len(seen._bits)  # the recent set not counted
    assert held < 300_000 * 16  # 8 bytes a member in runs, the bitmap 2-4 more


def test_key64_is_the_keys_first_64_bits() -> None:
    key = cache_key("http://x/v1", {"model": "m", "messages": []}, 0)
    assert key64(key) == int.from_bytes(bytes.fromhex(key)[:8], "big")
    assert 0 <= key64(key) < 2**64
