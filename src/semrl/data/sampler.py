"""A seeded, resumable sampler over a fixed list: a new permutation every epoch."""

from __future__ import annotations

import random
from typing import Any


class EpochSampler:
    """Problem indices in a fresh seeded order every epoch, resumable (``state_dict``): the same on
    every process."""

    def __init__(self, size: int, seed: int) -> None:
        if size < 1:
            raise ValueError("cannot sample from an empty dataset")
        self.size = size
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(self.size))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def next_indices(self, n: int) -> list[int]:
        out: list[int] = []
        while len(out) < n:
            if self.position >= self.size:
                self.epoch += 1
                self.position = 0
                self._order = self._permutation(self.epoch)
            out.append(self._order[self.position])
            self.position += 1
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"size": self.size, "seed": self.seed, "epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["size"] != self.size:
            raise ValueError(
                f"the checkpoint's sampler saw {state['size']} problems but the dataset now has "
                f"{self.size}; resume with the same data"
            )
        self.seed, self.epoch, self.position = state["seed"], state["epoch"], state["position"]
        self._order = self._permutation(self.epoch)
