"""A figure watched on a thread of its own while a scenario runs."""

from __future__ import annotations

import contextlib
import threading
from typing import Self


class Poller:
    """Calls `poll()` every `interval` seconds inside a `with` block; a poll that raises is
    skipped (the cluster or a pod is briefly unreachable) and the next one tries again."""

    interval: float = 1.0

    def poll(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self.__stop.is_set():
            with contextlib.suppress(Exception):
                self.poll()
            self.__stop.wait(self.interval)

    def __enter__(self) -> Self:
        self.__stop = threading.Event()
        self.__thread = threading.Thread(target=self._run, daemon=True, name=type(self).__name__)
        self.__thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.__stop.set()
        self.__thread.join(10)
