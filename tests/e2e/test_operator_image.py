"""The operator image's recipe (operator/Dockerfile), checked without a container runtime:
its `pip install` steps, as written, in a fresh virtualenv (tests/support/image_recipe.py)
give an environment that has the operator and none of the runtime's dependencies, whose
entrypoint answers `--help`, and whose operator reconciles a model on the local cluster."""

from __future__ import annotations

import contextlib
import importlib.util
import time
from pathlib import Path

import pytest

from pdwarden_localcluster.waits import wait_for
from pdwarden_testkit.kubectl import Kubectl
from tests.support import image_recipe

from ._operator_helpers import (
    CHILD_RESOURCES,
    ROOT,
    idle_model,
    kubectl_with_crd,
    new_namespace,
    operator_for_prefix,
)

pytestmark = pytest.mark.e2e

DOCKERFILE = ROOT / "operator" / "Dockerfile"
NS_PREFIX = "pdwe-image-"
# What an operator image must not carry: the runtime's heavy dependencies.
# what the entrypoint imports (as the Dockerfile's last step checks)
OPERATOR_IMPORTS = "import pdwarden_operator.cli, pdwarden_operator.handlers"
RUNTIME_ONLY = ("torch", "sglang", "nixl", "smg", "zmq")
# ... nor the project's other packages: the runtime and the development distribution
NOT_THE_OPERATORS = ("pdwarden_runtime", "pdwarden_localcluster", "pdwarden_bench", "pdwarden_demo", "tests")
EXPECTED_CHILDREN = {"deployments/slim-prefill", "deployments/slim-decode", "deployments/slim-router"}


@pytest.fixture(scope="module")
def operator_env(tmp_path_factory: pytest.TempPathFactory) -> image_recipe.Environment:
    if not image_recipe.same_python(DOCKERFILE):
        pytest.fail(
            f"{DOCKERFILE}'s PYTHON_VERSION is not this Python's minor version: the recipe is untested"
        )
    started = time.monotonic()
    env = image_recipe.build(DOCKERFILE, tmp_path_factory.mktemp("operator-image"))
    # figures for the closing notes of changes to the image (printed with -s)
    built = time.monotonic() - started
    started = time.monotonic()
    env.run("python", "-c", OPERATOR_IMPORTS)
    print(
        f"operator environment: {env.size_mib():.0f} MiB, built in {built:.0f}s, "
        f"the operator imported in {time.monotonic() - started:.2f}s"
    )
    return env


@pytest.fixture(scope="module")
def kubectl(cluster: object) -> Kubectl:
    return kubectl_with_crd(cluster.kubeconfig)  # type: ignore[attr-defined]


def test_the_recipe_installs_the_operator_and_nothing_of_the_runtime(
    operator_env: image_recipe.Environment,
) -> None:
    assert any("--constraint constraints.txt" in c for c in operator_env.pip_commands), (
        "the pins are not used"
    )
    help_text = operator_env.run("pdwarden", "operator", "run", "--help")
    assert help_text.returncode == 0, help_text.stderr
    assert "--namespace" in help_text.stdout
    imports = operator_env.run("python", "-c", OPERATOR_IMPORTS)
    assert imports.returncode == 0, imports.stderr
    present = operator_env.importable(*RUNTIME_ONLY, *NOT_THE_OPERATORS)
    assert present == [], f"the operator environment carries {present}"
    # its `pdwarden` has the operator's commands only (the others' distributions are absent)
    assert operator_env.commands() == ["crd", "operator"]
    # the control: this checkout's own environment has the runtime, so the probe can see one
    assert importlib.util.find_spec("nixl") is not None
    # the installed package, not this checkout: nothing imports from the source tree
    where = operator_env.run("python", "-c", "import pdwarden_operator; print(pdwarden_operator.__file__)")
    assert Path(where.stdout.strip()).is_relative_to(operator_env.root), where.stdout


def test_the_recipes_operator_reconciles_a_model(
    operator_env: image_recipe.Environment, kubectl: Kubectl, tmp_path: Path
) -> None:
    exe = operator_env.bin / "pdwarden"
    running = contextlib.contextmanager(operator_for_prefix)
    with (
        running(kubectl, NS_PREFIX, tmp_path / "operator.log", executable=exe, allow=()) as op,
        contextlib.contextmanager(new_namespace)(kubectl, NS_PREFIX) as ns,
    ):
        assert op.command()[0] == str(exe)
        kubectl.apply(idle_model("slim"), ns)

        def children() -> set[str]:
            names = {
                f"{kind}/{o['metadata']['name']}"
                for kind in CHILD_RESOURCES
                for o in kubectl.items(kind, ns, "pdwarden.io/model=slim")
            }
            return names if names >= EXPECTED_CHILDREN else set()

        wait_for(children, 120, "the model's children, applied by the recipe's operator", 1.0)
        assert op.proc is not None and op.proc.poll() is None
