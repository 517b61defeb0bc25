"""Where every random draw of the generator comes from.

A sample must be reproducible alone, in any worker and any order, from the recorded global seed:
each sample gets its own ``random.Random`` seeded from ``(seed, split, index)``, and decisions that
are not part of a sample (which split a source falls in) come from a hash of their own parts.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable


def sample_seed(seed: int, split: str, index: int) -> int:
    """The 64-bit seed of one sample, from the recorded global seed alone."""
    return int.from_bytes(hashlib.blake2b(f"{seed}:{split}:{index}".encode(), digest_size=8).digest(), "big")


def unit(*parts: object) -> float:
    """A deterministic number in [0, 1) from ``parts``."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def weighted_choice(rng: random.Random, weighted: Iterable[tuple[str, float]]) -> str:
    """One key of ``(key, weight)`` pairs, drawn in proportion to its weight."""
    items = list(weighted)
    return rng.choices([k for k, _ in items], weights=[w for _, w in items])[0]
