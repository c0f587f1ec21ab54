"""The runtime image's recipe (runtime/Dockerfile), checked without a container runtime: its
`pip install` steps, as written, in a fresh virtualenv over this checkout's own third-party
packages (standing for SGLang's image: torch, SGLang, NIXL, smg), with the image's own last
check, the doctor, run by the recipe itself. The environment runs the entrypoint, has the
runtime and the contract from what it installed, and nothing else of the project."""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

import pytest

from tests.support import image_recipe

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "runtime" / "Dockerfile"
# the project's own distributions (and their editable hooks) never stand for the base image
PROJECT = ("pdwarden", "__editable__", "_pdwarden")
# what the entrypoint imports
RUNTIME_IMPORTS = "import pdwarden_cli.main, pdwarden_runtime.cli, pdwarden_contract"
NOT_THE_RUNTIMES = ("pdwarden_operator", "pdwarden_localcluster", "pdwarden_bench", "pdwarden_demo")


@pytest.fixture(scope="module")
def runtime_env(tmp_path_factory: pytest.TempPathFactory) -> image_recipe.Environment:
    scratch = tmp_path_factory.mktemp("runtime-image")
    site = Path(sysconfig.get_paths()["purelib"])
    assert site.is_relative_to(sys.prefix), site
    base = image_recipe.base_packages(site, scratch / "base", PROJECT)
    # the recipe's last RUN step is `pdwarden runtime doctor`: the build fails unless the
    # hardening is active in a process spawned the way SGLang spawns its scheduler
    return image_recipe.build(DOCKERFILE, scratch / "recipe", base=(base,))


def test_the_recipe_installs_the_runtime_passes_its_doctor_and_answers_help(
    runtime_env: image_recipe.Environment,
) -> None:
    commands = " ".join(runtime_env.pip_commands)
    assert "pdwarden runtime doctor --engine sglang --json" in commands
    assert "--no-deps ./core ./runtime" in commands  # the engines stay the base image's
    help_text = runtime_env.run("pdwarden", "runtime", "serve", "--engine", "sglang", "--help")
    assert help_text.returncode == 0, help_text.stderr
    assert "--role" in help_text.stdout and "--bootstrap-port" in help_text.stdout
    imports = runtime_env.run("python", "-c", RUNTIME_IMPORTS)
    assert imports.returncode == 0, imports.stderr


def test_the_environment_has_the_runtime_it_installed_and_nothing_else_of_the_project(
    runtime_env: image_recipe.Environment,
) -> None:
    where = runtime_env.run(
        "python",
        "-c",
        "import pdwarden_runtime, pdwarden_contract as c; print(pdwarden_runtime.__file__, c.__file__)",
    )
    assert where.returncode == 0, where.stderr
    for path in where.stdout.split():
        assert Path(path).is_relative_to(runtime_env.root), where.stdout  # installed, not the checkout
    present = runtime_env.importable(*NOT_THE_RUNTIMES)
    assert present == [], f"the runtime environment carries {present}"
    assert runtime_env.commands() == ["runtime"]
