"""Seeded sampling for the constructed crowd-labelled sets (MSCOCO documents, DII-Stress).

Why one ``random.Random`` per document seeded by a string: its output does not depend on worker,
order or other documents, and string seeds (SHA-512) are stable across processes."""

from __future__ import annotations

import random
from collections.abc import Callable


def rng_for(*parts: object) -> random.Random:
    """A generator seeded by the parts joined with ':' (e.g. rng_for('dii-stress', seed, doc_id))."""
    return random.Random(":".join(str(p) for p in parts))


def sample_excluding(rng: random.Random, n: int, k: int, excluded: Callable[[int], bool]) -> list[int] | None:
    """``k`` distinct indices of ``range(n)``, uniformly among those not ``excluded``, in draw order.

    None when fewer than ``k`` are eligible. Rejection sampling first (a pool of 100K captions
    minus the 50 of one document is almost all eligible, so this costs O(k), not O(n)); after
    a bounded number of rejections the eligible rest is listed once and sampled exactly, so a
    dense exclusion or a tiny pool never loops. Each accepted draw is uniform over the eligible
    indices not drawn yet in both phases, so the result is a uniform ordered sample.
    """
    if k <= 0:
        return []
    chosen: list[int] = []
    seen: set[int] = set()
    tries = 0
    limit = 8 * k + 64
    while len(chosen) < k and tries < limit and n > 0:
        tries += 1
        i = rng.randrange(n)
        if i in seen:
            continue
        seen.add(i)
        if not excluded(i):
            chosen.append(i)
    if len(chosen) < k:
        taken = set(chosen)
        rest = [i for i in range(n) if i not in taken and not excluded(i)]
        if len(rest) < k - len(chosen):
            return None
        chosen += rng.sample(rest, k - len(chosen))
    return chosen
