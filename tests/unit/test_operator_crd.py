"""The generated CRD: fresh on disk, structural, documented, with its CEL rules."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from pdwarden_operator import crd
from pdwarden_operator.schema import SchemaConversionError, to_structural

pytestmark = pytest.mark.unit


def test_crd_files_are_fresh() -> None:
    text = crd.crd_yaml()
    for path in crd.crd_paths():
        assert path.exists(), f"{path} missing: run `pdwarden crd --write`"
        assert path.read_text() == text, f"{path} is stale: run `pdwarden crd --write`"


def _walk(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, sub in (node.get("properties") or {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}.*")


def _version() -> dict[str, Any]:
    [version] = crd.build_crd()["spec"]["versions"]
    return version


def test_schema_is_structural() -> None:
    schema = _version()["schema"]["openAPIV3Schema"]
    text = yaml.safe_dump(schema)
    for forbidden in ("$ref", "anyOf", "oneOf", "allOf", "title", "$defs", "'null'"):
        assert forbidden not in text, f"{forbidden} in a structural schema"
    for path, node in _walk(schema):
        typed = "type" in node or node.get("x-kubernetes-int-or-string")
        assert typed, f"{path or '<root>'} has no type"
        assert node.get("additionalProperties") is not False, path
        assert not ("properties" in node and "additionalProperties" in node), path


def test_every_spec_field_is_described() -> None:
    spec = _version()["schema"]["openAPIV3Schema"]["properties"]["spec"]
    undocumented = [p for p, n in _walk(spec, "spec") if not n.get("description") and not p.endswith("[]")]
    assert undocumented == []
    watchdog = spec["properties"]["watchdog"]
    assert watchdog["default"]["stuckAfterSeconds"] == 360
    assert watchdog["properties"]["stuckAfterSeconds"]["default"] == 360
    assert watchdog["properties"]["action"]["default"] == "drain"
    assert watchdog["properties"]["action"]["enum"] == ["alert", "restart", "evict", "drain"]


def test_runtime_roles_carry_the_gpu_toleration_switch_on_by_default() -> None:
    """A field of its own, not a podTemplate null (which the API server prunes)."""
    spec = _version()["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for role in ("prefill", "decode"):
        field = spec["properties"][role]["properties"]["gpuToleration"]
        assert field["type"] == "boolean" and field["default"] is True
        assert "nullable" not in field
        assert "nvidia.com/gpu" in field["description"] and "false" in field["description"]
        # the role's own default object spells it out too (an absent role gets it)
        assert spec["properties"][role]["default"]["gpuToleration"] is True
    assert "gpuToleration" not in spec["properties"]["router"]["properties"], "the router has no GPUs"


def test_cel_rules_cover_the_cross_field_invariants() -> None:
    schema = _version()["schema"]["openAPIV3Schema"]
    rules = [r["rule"] for _, n in _walk(schema) for r in n.get("x-kubernetes-validations", [])]
    joined = "\n".join(rules)
    for fragment in (
        "self.router.replicas > 0",
        "self.tensorParallel <= (self.gpus > 0 ? self.gpus : 1)",
        "self.tensorParallel in [1, 2, 4, 8, 16, 32, 64]",
        "self.stuckAfterSeconds >= 2 * self.scrapeIntervalSeconds",
        "self.transferDeadlineSeconds <= self.inflightDeadlineSeconds",
        "self.watchdog.stuckAfterSeconds > self.transfer.inflightDeadlineSeconds",
        "size(self.metadata.name) <= 40",
    ):
        assert fragment in joined, fragment


def test_subresources_columns_and_names() -> None:
    obj = crd.build_crd()
    assert obj["metadata"]["name"] == "disaggregatedmodels.pdwarden.io"
    assert obj["spec"]["names"]["shortNames"] == ["dm"]
    version = _version()
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Ready",
        "Prefill",
        "Decode",
        "Phase",
        "Age",
    ]


def test_converter_rejects_untyped_unions() -> None:
    with pytest.raises(SchemaConversionError, match="non-null options"):
        to_structural(
            {"type": "object", "properties": {"x": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}}
        )
    with pytest.raises(SchemaConversionError, match="no type"):
        to_structural({"type": "object", "properties": {"x": {"description": "anything"}}})


def test_converter_inlines_refs_and_drops_null() -> None:
    src = {
        "type": "object",
        "$defs": {"Inner": {"type": "object", "title": "Inner", "properties": {"a": {"type": "integer"}}}},
        "properties": {
            "inner": {
                "anyOf": [{"$ref": "#/$defs/Inner"}, {"type": "null"}],
                "default": None,
                "description": "d",
            }
        },
    }
    assert to_structural(src) == {
        "type": "object",
        "properties": {
            "inner": {"type": "object", "description": "d", "properties": {"a": {"type": "integer"}}}
        },
    }
