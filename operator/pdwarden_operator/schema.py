"""pydantic JSON Schema -> Kubernetes structural OpenAPI v3 schema.

The API server accepts only *structural* schemas: every node has a type (or is an
int-or-string / preserve-unknown-fields node), no `$ref`, no `anyOf` used as a type union,
no `additionalProperties: false`, no `title`. This converter inlines `$defs`, turns
`Optional[X]` (`anyOf: [X, {type: null}]`) into plain `X` (an absent field, never null),
`const` into `enum`, free-form dicts into `x-kubernetes-preserve-unknown-fields`, and keeps
descriptions, defaults, bounds and `x-kubernetes-*` extensions.
"""

from __future__ import annotations

from typing import Any

# Keywords copied as they are (the rest are handled explicitly or dropped).
_KEEP = (
    "type",
    "description",
    "default",
    "enum",
    "format",
    "pattern",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "uniqueItems",
    "nullable",
)


class SchemaConversionError(ValueError):
    """The pydantic schema uses a construct with no structural equivalent."""


def to_structural(schema: dict[str, Any]) -> dict[str, Any]:
    """Convert a pydantic `model_json_schema()` (with `$defs`) to a structural schema."""
    defs = schema.get("$defs", {})
    return _convert(schema, defs, path="")


def _resolve(node: dict[str, Any], defs: dict[str, Any], path: str) -> dict[str, Any]:
    """Inline a `$ref`; the referring node's own keys (e.g. its description) win."""
    seen: set[str] = set()
    while "$ref" in node:
        ref = node["$ref"]
        if ref in seen:
            raise SchemaConversionError(f"{path or '<root>'}: recursive $ref {ref} cannot be structural")
        seen.add(ref)
        name = ref.rsplit("/", 1)[-1]
        if name not in defs:
            raise SchemaConversionError(f"{path or '<root>'}: unknown $ref {ref}")
        own = {k: v for k, v in node.items() if k != "$ref"}
        node = {**defs[name], **own}
    return node


def _strip_null(node: dict[str, Any], path: str) -> dict[str, Any]:
    """`anyOf: [X, {type: null}]` -> X (merged with the outer description/default)."""
    for key in ("anyOf", "oneOf"):
        if key not in node:
            continue
        options = [o for o in node[key] if o.get("type") != "null"]
        if len(options) != 1:
            raise SchemaConversionError(
                f"{path or '<root>'}: {key} with {len(options)} non-null options is not structural"
            )
        outer = {k: v for k, v in node.items() if k != key}
        if outer.get("default", "") is None:
            del outer["default"]  # `= None` means "absent", not a null default
        node = {**options[0], **outer}
    return node


def _convert(node: dict[str, Any], defs: dict[str, Any], path: str) -> dict[str, Any]:
    node = _resolve(node, defs, path)
    node = _strip_null(node, path)
    node = _resolve(node, defs, path)

    if node.get("x-kubernetes-int-or-string"):
        return {k: v for k, v in node.items() if k.startswith("x-kubernetes-") or k == "description"}

    out: dict[str, Any] = {}
    for key in _KEEP:
        if key in node:
            out[key] = node[key]
    for bound, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        # JSON Schema's numeric exclusive bound (pydantic's gt/lt) is OpenAPI v3.0's boolean flag
        if not isinstance(out.get(exclusive, True), bool):
            out[bound], out[exclusive] = out[exclusive], True
    if "const" in node:
        out["enum"] = [node["const"]]
    if "enum" in out and "type" not in out:
        out["type"] = _enum_type(out["enum"], path)
    for key, value in node.items():
        if key.startswith("x-kubernetes-"):
            out[key] = value

    kind = out.get("type")
    if kind is None:
        raise SchemaConversionError(f"{path or '<root>'}: no type (an untyped field is not structural)")
    if kind == "object":
        _convert_object(node, out, defs, path)
    elif kind == "array":
        if "items" not in node:
            raise SchemaConversionError(f"{path}: array without items")
        out["items"] = _convert(node["items"], defs, f"{path}[]")
    return out


def _convert_object(node: dict[str, Any], out: dict[str, Any], defs: dict[str, Any], path: str) -> None:
    props = node.get("properties")
    extra = node.get("additionalProperties")
    if props:
        out["properties"] = {name: _convert(sub, defs, f"{path}.{name}") for name, sub in props.items()}
        required = [r for r in node.get("required", []) if r in props]
        if required:
            out["required"] = required
        if extra not in (None, False):
            # extra="allow": keep declared fields typed, let unknown ones through.
            out["x-kubernetes-preserve-unknown-fields"] = True
    elif isinstance(extra, dict) and extra:
        out["additionalProperties"] = _convert(extra, defs, f"{path}.*")
    else:
        # A free-form dict (dict[str, Any]): the API server keeps whatever is sent.
        out["x-kubernetes-preserve-unknown-fields"] = True


def _enum_type(values: list[Any], path: str) -> str:
    kinds = {type(v) for v in values}
    if kinds <= {str}:
        return "string"
    if kinds <= {int}:
        return "integer"
    if kinds <= {bool}:
        return "boolean"
    raise SchemaConversionError(f"{path}: enum of mixed types {sorted(k.__name__ for k in kinds)}")
