"""The Helm chart seen from Python: render it with the real `helm`, pick out its alert rules.

Used by `pdwarden demo` (install) and by the chart and alert tests (the rules evaluated by
promtool). Rendering and tool lookup run processes; the functions that pick
objects out of rendered manifests and read PromQL are pure.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

# demo/pdwarden_demo/chart.py -> repository root
REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "charts" / "pdwarden"
ALERTS_DOC = REPO_ROOT / "docs" / "alerts.md"


class ToolMissing(RuntimeError):
    """A pinned tool (helm, kubectl, promtool) is not installed."""


class HelmError(RuntimeError):
    """helm refused the chart or the values; the message is helm's own."""


def find_tool(name: str) -> str:
    """Path of a pinned tool: $PDWARDEN_<NAME>, the local cluster's installed tools, then PATH."""
    override = os.environ.get(f"PDWARDEN_{name.upper()}")
    if override:
        return override
    installed = _localcluster_tool(name)
    if installed is not None:
        return installed
    found = shutil.which(name)
    if found:
        return found
    raise ToolMissing(f"{name} is not installed: run `make setup` (it installs the pinned {name})")


def _localcluster_tool(name: str) -> str | None:
    """Where `python -m pdwarden_localcluster.tools install` put the tool, if it did."""
    from pdwarden_localcluster.tools import tool_path

    path = tool_path(name)
    return str(path) if path.exists() else None


def helm_template(
    *,
    release: str = "pdwarden",
    namespace: str = "pdwarden-system",
    set_values: Mapping[str, str] | None = None,
    values_files: Sequence[Path] = (),
    include_crds: bool = False,
    chart: Path = CHART_DIR,
) -> list[dict[str, Any]]:
    """The chart's manifests as helm renders them (with schema validation), as objects."""
    cmd = [find_tool("helm"), "template", release, str(chart), "--namespace", namespace]
    cmd += helm_value_args(set_values, values_files)
    if include_crds:
        cmd.append("--include-crds")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode != 0:
        raise HelmError(proc.stderr.strip() or proc.stdout.strip())
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def helm_value_args(set_values: Mapping[str, str] | None, values_files: Sequence[Path] = ()) -> list[str]:
    """`--set-string`-free value flags: `--set k=v` keeps numbers and booleans typed for the schema."""
    args: list[str] = []
    for path in values_files:
        args += ["--values", str(path)]
    for key, value in (set_values or {}).items():
        args += ["--set", f"{key}={value}"]
    return args


def find_objects(docs: Iterable[Mapping[str, Any]], kind: str) -> list[Mapping[str, Any]]:
    return [doc for doc in docs if doc.get("kind") == kind]


def only_object(docs: Iterable[Mapping[str, Any]], kind: str) -> Mapping[str, Any]:
    found = find_objects(docs, kind)
    if len(found) != 1:
        raise ValueError(f"expected exactly one {kind} in the rendered chart, found {len(found)}")
    return found[0]


def rule_groups(docs: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The PrometheusRule's spec: a Prometheus rules file (`groups: [...]`) as promtool reads it."""
    spec = only_object(docs, "PrometheusRule")["spec"]
    return {"groups": list(spec["groups"])}


def alert_rules(groups: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [rule for group in groups["groups"] for rule in group["rules"] if "alert" in rule]


def without_annotations(groups: Mapping[str, Any]) -> dict[str, Any]:
    """The same rules minus annotations: promtool's expected alerts then need only labels."""
    return {
        "groups": [
            {
                **group,
                "rules": [{k: v for k, v in rule.items() if k != "annotations"} for rule in group["rules"]],
            }
            for group in groups["groups"]
        ]
    }


# PromQL words that are not metric names.
_PROMQL_KEYWORDS = frozenset(
    {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool"}
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w.:])([A-Za-z_:][A-Za-z0-9_:]*)(?![\w:])(?!\s*\()")


def promql_metric_names(expr: str) -> set[str]:
    """Metric names an expression selects (functions, keywords, labels and durations removed)."""
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    names = {m.group(1) for m in _IDENT.finditer(text)}
    return {n for n in names if n.lower() not in _PROMQL_KEYWORDS}


def runbook_anchors(markdown: str) -> set[str]:
    """GitHub-style anchors of the `##`/`###` headings of a Markdown document."""
    anchors = set()
    for line in markdown.splitlines():
        m = re.match(r"^#{2,3}\s+(.*?)\s*$", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
            anchors.add(slug)
    return anchors


def dump_yaml(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False)
