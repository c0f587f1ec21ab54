"""Prometheus text -> samples, with prometheus_client's parser: the benchmarks', the tests' and
the demo's one reader of `/metrics` pages (the watchdog's stricter reader,
`pdwarden_operator.watchdog.parse`, is built on the same parser)."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Sample:
    name: str  # as exposed: a counter's with `_total`, a histogram's with `_bucket`/`_sum`/`_count`
    labels: dict[str, str]
    value: float


def samples(text: str, names: Collection[str] | None = None) -> list[Sample]:
    """Every sample of the page (only those named in `names`, when given).

    Raises ValueError on text the parser refuses."""
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if names is None or s.name in names:
                out.append(Sample(s.name, dict(s.labels), float(s.value)))
    return out


def metric_sum(found: Iterable[Sample], name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    return sum(
        s.value for s in found if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )
