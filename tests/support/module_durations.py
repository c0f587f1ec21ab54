"""module_durations.json: how long each long test module takes in a whole run, read by the
queue's order (tests/conftest.py) and written here from runs' `--junitxml`.

A module's seconds are its tests' setup, call and teardown as the junit file reports them,
summed; over several runs, the least (a run slowed by something else says nothing about the
module); to the nearest ROUND_S; modules under MIN_SECONDS left out, as the queue counts them
short anyway. A module the runs do not name keeps what the file said (a partial run does not
forget the rest); a module whose file is gone is dropped.

    python -m tests.support.module_durations RUN.xml [RUN.xml ...]

(`make test-durations JUNIT="run1.xml run2.xml"`, each from `make test ARGS=--junitxml=run1.xml`.)
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Final

DURATIONS: Final = Path(__file__).with_name("module_durations.json")
ROOT: Final = Path(__file__).resolve().parents[2]
MIN_SECONDS: Final = 10
ROUND_S: Final = 5


class NotJunit(ValueError):
    """The file is not a pytest `--junitxml` report; the message names it."""


def measured_seconds() -> dict[str, float]:
    """Seconds by module path (as in a node id)."""
    seconds: dict[str, float] = json.loads(DURATIONS.read_text())
    return seconds


def module_of(classname: str, exists: Callable[[str], bool]) -> str | None:
    """The module path (`tests/e2e/test_demo.py`) of a junit classname (`tests.e2e.test_demo`,
    or with a class after it: `tests.e2e.test_demo.TestX`): its longest dotted start that names
    a file; None when none does."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        path = "/".join(parts[:end]) + ".py"
        if exists(path):
            return path
    return None


def run_seconds(junit: Path, exists: Callable[[str], bool]) -> dict[str, float]:
    """Each module's seconds in one run (its test cases' times, summed)."""
    try:
        root = ET.parse(junit).getroot()  # the user's own pytest report
    except (ET.ParseError, OSError) as exc:
        raise NotJunit(f"{junit}: not a junit XML report: {exc}") from None
    if root.tag not in ("testsuites", "testsuite"):
        raise NotJunit(f"{junit}: not a junit XML report (its root is <{root.tag}>)")
    cases = list(root.iter("testcase"))
    if not cases:
        raise NotJunit(f"{junit}: a junit report with no test case")
    seconds: dict[str, float] = defaultdict(float)
    for case in cases:
        module = module_of(case.get("classname", ""), exists)
        if module is not None:
            seconds[module] += float(case.get("time") or 0.0)
    return dict(seconds)


def merged(
    runs: Sequence[Mapping[str, float]], before: Mapping[str, float], exists: Callable[[str], bool]
) -> dict[str, int]:
    """The file's new content: each module the runs name, the least of their seconds rounded;
    the ones they do not name as they were, while their files exist. Sorted by module."""
    least: dict[str, float] = {}
    for run in runs:
        for module, seconds in run.items():
            least[module] = min(seconds, least.get(module, seconds))
    out = {
        module: round(seconds) for module, seconds in before.items() if module not in least and exists(module)
    }
    for module, seconds in least.items():
        rounded = ROUND_S * round(seconds / ROUND_S)
        if rounded >= MIN_SECONDS:
            out[module] = rounded
    return dict(sorted(out.items()))


def changes(before: Mapping[str, float], after: Mapping[str, float]) -> Iterable[str]:
    """One line per module whose seconds changed, came or went."""
    for module in sorted(set(before) | set(after)):
        old, new = before.get(module), after.get(module)
        if old != new:
            yield f"{module}: {'-' if old is None else f'{old:g}'} -> {'-' if new is None else f'{new:g}'}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.module_durations",
        description="Write tests/support/module_durations.json from whole runs' --junitxml.",
    )
    parser.add_argument("junit", nargs="+", type=Path, help="a `make test ARGS=--junitxml=FILE` report")
    args = parser.parse_args(argv)

    def exists(module: str) -> bool:
        return (ROOT / module).is_file()

    try:
        runs = [run_seconds(path, exists) for path in args.junit]
    except NotJunit as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    before = measured_seconds()
    after = merged(runs, before, exists)
    DURATIONS.write_text(json.dumps(after, indent=2) + "\n")
    lines = list(changes(before, after))
    print(f"{DURATIONS.relative_to(ROOT)}: {len(after)} modules, {len(lines)} changed")
    for line in lines:
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
