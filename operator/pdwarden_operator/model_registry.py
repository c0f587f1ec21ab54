"""Every per-model store of the operator, forgotten together.

A model that is gone (deleted, its namespace being deleted, found missing by a resync or by
its watchdog, or replaced by a new object of the same name) must leave nothing behind in any
store: a stale entry keeps a gauge alarming, a brake counting or a status writer comparing
with an older object. Each store implements `Forgets`; `context.OperatorContext` registers
them all once, and one call forgets the model everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


class Forgets(Protocol):
    """A store that keeps something per model."""

    def forget(self, namespace: str, name: str, /) -> None:
        """Drop everything kept for the model (nothing when nothing is kept)."""


@dataclass
class ModelRegistry:
    """The stores that keep something per model."""

    stores: list[Forgets] = field(default_factory=list)

    def register(self, *stores: Forgets) -> None:
        self.stores.extend(stores)

    def forget(self, namespace: str, name: str) -> None:
        """The model is gone: every store drops it."""
        for store in self.stores:
            store.forget(namespace, name)
