"""runtime/Dockerfile (not built here): it parses, pins the supported versions, and its
entrypoint is the sglang launcher."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "runtime" / "Dockerfile"
INSTRUCTIONS = {
    "FROM",
    "ARG",
    "RUN",
    "CMD",
    "LABEL",
    "EXPOSE",
    "ENV",
    "ADD",
    "COPY",
    "ENTRYPOINT",
    "VOLUME",
    "USER",
    "WORKDIR",
    "ONBUILD",
    "STOPSIGNAL",
    "HEALTHCHECK",
    "SHELL",
}


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, args = full.partition(" ")
        out.append((keyword, args.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return out


def args_defaults() -> dict[str, str]:
    found: dict[str, str] = {}
    for keyword, args in instructions():
        if keyword == "ARG" and "=" in args:
            name, _, value = args.partition("=")
            assert found.get(name, value) == value, f"ARG {name} has two different defaults"
            found[name] = value
    return found


def runtime_pins() -> dict[str, str]:
    meta = tomllib.loads((ROOT / "runtime" / "pyproject.toml").read_text())
    pins = {}
    for req in meta["project"]["optional-dependencies"]["engines"]:
        name, sep, version = req.partition("==")
        if sep:
            pins[name.strip()] = version.strip()
    return pins


def test_every_instruction_is_a_dockerfile_instruction() -> None:
    found = instructions()
    assert found, "empty Dockerfile"
    assert {k for k, _ in found} <= INSTRUCTIONS
    first_non_arg = next(k for k, _ in found if k != "ARG")
    assert first_non_arg == "FROM"


def test_base_image_is_the_official_sglang_image_at_the_pinned_version() -> None:
    froms = [a for k, a in instructions() if k == "FROM"]
    assert froms == ["lmsysorg/sglang:v${SGLANG_VERSION}-${CUDA_TAG}"]


def test_versions_match_the_pins_and_the_hardening() -> None:
    from pdwarden_runtime.hardening import SUPPORTED_NIXL, SUPPORTED_SGLANG

    defaults = args_defaults()
    pins = runtime_pins()
    assert defaults["SGLANG_VERSION"] == pins["sglang"]
    assert defaults["SGLANG_VERSION"] in SUPPORTED_SGLANG
    assert defaults["NIXL_VERSION"] == pins["nixl"]
    assert defaults["NIXL_VERSION"] in SUPPORTED_NIXL
    assert defaults["SMG_VERSION"] == pins["smg"]
    constraints = (ROOT / "constraints.txt").read_text()
    assert re.search(
        rf"^prometheus[-_]client=={re.escape(defaults['PROMETHEUS_CLIENT_VERSION'])}$",
        constraints,
        re.M | re.I,
    )


def test_entrypoint_is_the_sglang_launcher() -> None:
    entry = [a for k, a in instructions() if k == "ENTRYPOINT"]
    assert len(entry) == 1
    argv = json.loads(entry[0])  # exec form: no shell between the kubelet's signals and pdwarden
    assert argv == ["pdwarden", "runtime", "serve", "--engine", "sglang"]
    from pdwarden_cli.main import cli

    result = CliRunner().invoke(cli, [*argv[1:], "--help"])
    assert result.exit_code == 0, result.output
    assert "--role" in result.output and "--bootstrap-port" in result.output


def test_the_image_build_checks_the_hardening_and_copies_what_exists() -> None:
    runs = [a for k, a in instructions() if k == "RUN"]
    assert any("pdwarden runtime doctor --engine sglang" in r for r in runs)
    for keyword, args in instructions():
        if keyword == "COPY":
            *sources, _dest = args.split()
            for src in sources:
                assert (ROOT / src).exists(), f"COPY source {src} is missing"
    exposed = {int(p) for k, a in instructions() if k == "EXPOSE" for p in a.split()}
    import pdwarden_contract as c

    assert exposed == {c.DEFAULT_HTTP_PORT, c.DEFAULT_BOOTSTRAP_PORT, c.DEFAULT_METRICS_PORT}
