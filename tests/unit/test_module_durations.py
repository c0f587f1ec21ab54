"""module_durations.json and its writer (tests/support/module_durations.py): junit reports ->
each long module's least seconds over runs, what the runs do not name kept, gone modules dropped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import module_durations
from tests.support.module_durations import (
    DURATIONS,
    ROOT,
    NotJunit,
    changes,
    measured_seconds,
    merged,
    module_of,
    run_seconds,
)

pytestmark = pytest.mark.unit

MODULES = {"tests/e2e/test_demo.py", "tests/e2e/test_groups.py", "tests/unit/test_rule.py"}


def _exists(module: str) -> bool:
    return module in MODULES


def _junit(path: Path, cases: list[tuple[str, float]]) -> Path:
    rows = "".join(f'<testcase classname="{c}" name="t{i}" time="{t}" />' for i, (c, t) in enumerate(cases))
    suite = f'<testsuites><testsuite name="pytest">{rows}</testsuite></testsuites>'
    path.write_text(f'<?xml version="1.0" encoding="utf-8"?>{suite}')
    return path


def test_the_measured_durations_name_modules_that_exist() -> None:
    seconds = measured_seconds()
    assert seconds and all(s >= module_durations.MIN_SECONDS for s in seconds.values())
    missing = [module for module in seconds if not (ROOT / module).is_file()]
    assert missing == [], f"module_durations.json names modules that are gone: {missing}"
    # the file is as the writer writes it: sorted, rounded, nothing else
    assert DURATIONS.read_text() == json.dumps(merged([], seconds, lambda m: True), indent=2) + "\n"


def test_a_classname_names_its_module_with_or_without_a_class() -> None:
    assert module_of("tests.e2e.test_demo", _exists) == "tests/e2e/test_demo.py"
    assert module_of("tests.e2e.test_demo.TestRollout", _exists) == "tests/e2e/test_demo.py"
    assert module_of("tests.e2e.test_gone", _exists) is None
    assert module_of("", _exists) is None


def test_a_run_sums_each_modules_cases(tmp_path: Path) -> None:
    junit = _junit(
        tmp_path / "run.xml",
        [
            ("tests.e2e.test_demo", 100.5),
            ("tests.e2e.test_demo.TestX", 20.25),
            ("tests.unit.test_rule", 0.5),
            ("tests.e2e.test_gone", 50.0),  # a module no longer there: not counted
        ],
    )
    assert run_seconds(junit, _exists) == {"tests/e2e/test_demo.py": 120.75, "tests/unit/test_rule.py": 0.5}


def test_the_least_run_counts_short_modules_go_and_unnamed_ones_stay() -> None:
    runs = [
        {"tests/e2e/test_demo.py": 163.0, "tests/unit/test_rule.py": 0.5},
        {"tests/e2e/test_demo.py": 171.0, "tests/unit/test_rule.py": 12.4},  # a slowed run
    ]
    before = {"tests/e2e/test_groups.py": 155, "tests/e2e/test_removed.py": 40, "tests/unit/test_rule.py": 15}
    after = merged(runs, before, _exists)
    assert after == {
        "tests/e2e/test_demo.py": 165,  # the least, to the nearest 5 s
        "tests/e2e/test_groups.py": 155,  # not in the runs: kept
    }  # test_rule: under 10 s in its least run; test_removed: its file is gone
    assert list(after) == sorted(after)
    assert list(changes(before, after)) == [
        "tests/e2e/test_demo.py: - -> 165",
        "tests/e2e/test_removed.py: 40 -> -",
        "tests/unit/test_rule.py: 15 -> -",
    ]


@pytest.mark.parametrize(
    "content",
    ["not xml at all", "<html><body/></html>", '<?xml version="1.0"?><testsuites><testsuite/></testsuites>'],
)
def test_a_file_that_is_no_junit_report_is_refused_by_name(tmp_path: Path, content: str) -> None:
    path = tmp_path / "report.xml"
    path.write_text(content)
    with pytest.raises(NotJunit, match=r"report\.xml"):
        run_seconds(path, _exists)


def test_main_writes_the_file_and_refuses_a_bad_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "module_durations.json"
    target.write_text(json.dumps({"tests/e2e/test_groups.py": 155}, indent=2) + "\n")
    monkeypatch.setattr(module_durations, "DURATIONS", target)
    monkeypatch.setattr(module_durations, "ROOT", tmp_path)
    for module in MODULES:
        (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / module).touch()
    run = _junit(tmp_path / "run.xml", [("tests.e2e.test_demo", 42.0), ("tests.e2e.test_groups", 160.9)])

    assert module_durations.main([str(run)]) == 0
    assert json.loads(target.read_text()) == {"tests/e2e/test_demo.py": 40, "tests/e2e/test_groups.py": 160}
    assert "2 modules, 2 changed" in capsys.readouterr().out

    bad = tmp_path / "bad.xml"
    bad.write_text("<oops")
    assert module_durations.main([str(run), str(bad)]) == 2
    assert "bad.xml" in capsys.readouterr().err
    assert json.loads(target.read_text()) == {"tests/e2e/test_demo.py": 40, "tests/e2e/test_groups.py": 160}
