"""Pure pieces of the Go tools module: reading go.mod text and writing the replace lines.

k8s.io/kubernetes requires its staging modules (k8s.io/api, k8s.io/client-go, ...) at
v0.0.0 and points them at ./staging/src with replace lines that do not apply to a module
that depends on it. Each one therefore needs `replace k8s.io/X => k8s.io/X v0.MINOR.PATCH`
in our module. The list comes from the go.mod the module proxy serves, never by hand.
"""

from __future__ import annotations

import re

_REQUIREMENT = re.compile(r"^(\S+)\s+(v\S+)$")
_VERSION = re.compile(r"^v1\.(\d+)\.(\d+)$")


def pinned_version(go_mod_text: str, module: str = "k8s.io/kubernetes") -> str:
    """The version our go.mod requires for `module` (e.g. "v1.35.4")."""
    try:
        return requirements(go_mod_text)[module]
    except KeyError:
        raise ValueError(f"go.mod does not require {module}") from None


def requirements(go_mod_text: str) -> dict[str, str]:
    """Every module a go.mod requires, with its version: `require M V` lines and the lines of
    `require ( ... )` blocks (never those of replace, exclude or retract blocks)."""
    found = {}
    block = ""
    for line in _strip_comments(go_mod_text):
        stripped = line.strip()
        if block:
            if stripped == ")":
                block = ""
            elif block == "require" and (m := _REQUIREMENT.match(stripped)):
                found[m.group(1)] = m.group(2)
            continue
        if stripped.endswith("("):
            block = stripped.removesuffix("(").strip()
        elif stripped.startswith("require ") and (m := _REQUIREMENT.match(stripped.removeprefix("require "))):
            found[m.group(1)] = m.group(2)
    return found


def staging_version(kubernetes_version: str) -> str:
    """Staging modules are tagged v0.MINOR.PATCH for kubernetes v1.MINOR.PATCH."""
    m = _VERSION.match(kubernetes_version)
    if not m:
        raise ValueError(f"not a kubernetes release version: {kubernetes_version!r} (want v1.MINOR.PATCH)")
    return f"v0.{m.group(1)}.{m.group(2)}"


def staging_modules(kubernetes_go_mod: str) -> list[str]:
    """Modules the kubernetes go.mod requires at v0.0.0 or replaces with ./staging paths."""
    found = {
        module
        for module, version in requirements(kubernetes_go_mod).items()
        if version == "v0.0.0" and module.startswith("k8s.io/")
    }
    for line in _strip_comments(kubernetes_go_mod):
        stripped = line.strip()
        if "=>" in stripped:
            left, right = (part.strip() for part in stripped.removeprefix("replace").split("=>", 1))
            if right.startswith("./staging/"):
                found.add(left.split()[0])
    return sorted(found)


def replace_block(modules: list[str], version: str) -> str:
    """A go.mod `replace ( ... )` block pinning every staging module to `version`."""
    if not modules:
        raise ValueError("no staging modules found in the kubernetes go.mod")
    lines = [f"\t{mod} => {mod} {version}" for mod in modules]
    return "// Generated from the go.mod the module proxy serves for k8s.io/kubernetes.\nreplace (\n" + (
        "\n".join(lines) + "\n)\n"
    )


def render_go_mod(our_go_mod: str, kubernetes_go_mod: str) -> str:
    """Our go.mod plus the generated replace block."""
    version = pinned_version(our_go_mod)
    modules = staging_modules(kubernetes_go_mod)
    return our_go_mod.rstrip("\n") + "\n\n" + replace_block(modules, staging_version(version))


def _strip_comments(text: str) -> list[str]:
    return [line.split("//", 1)[0] for line in text.splitlines()]
