"""An image's Python environment built without a container runtime, from its Dockerfile.

The Dockerfile's COPY steps lay the build context out in a scratch directory and its
`pip install` RUN steps run there, as written (its ARG defaults in their environment, as
Docker gives them), with a fresh virtualenv's Python first on PATH (the image runs them with
its base image's Python). Only those kinds of step are carried out: what the recipe installs
is what this environment gets, and nothing else. A recipe whose base image brings packages
of its own (SGLang's image: torch, SGLang, NIXL) gets `base`: directories of installed
packages that stand for them, on the environment's path behind its own.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Step:
    instruction: str  # upper case: RUN, COPY, ...
    argument: str


def steps(dockerfile: str) -> list[Step]:
    """The instructions of a Dockerfile, continuation lines joined, comments dropped."""
    lines = [line for line in dockerfile.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\s*\n", " ", "\n".join(lines))
    out = []
    for line in joined.splitlines():
        if line.strip():
            instruction, _, argument = line.strip().partition(" ")
            out.append(Step(instruction.upper(), argument.strip()))
    return out


def arg_default(dockerfile: str, name: str) -> str | None:
    for step in steps(dockerfile):
        if step.instruction == "ARG" and step.argument.startswith(f"{name}="):
            return step.argument.split("=", 1)[1]
    return None


def _env(step: Step) -> dict[str, str]:
    """An ENV step's variables (`ENV K=V K2=V2`)."""
    return dict(pair.split("=", 1) for pair in step.argument.split() if "=" in pair)


@dataclass(frozen=True)
class Environment:
    root: Path  # the virtualenv
    pip_commands: tuple[str, ...]  # the RUN steps carried out

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}"}
        env.pop("PYTHONPATH", None)
        return subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout, cwd="/")

    def importable(self, *modules: str) -> list[str]:
        """Which of `modules` this environment's Python finds."""
        probe = (
            "import importlib.util, sys; "
            "print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m)))"
        )
        found = self.run("python", "-c", probe, *modules)
        if found.returncode != 0:
            raise RuntimeError(f"the import probe failed: {found.stderr[-2000:]}")
        return found.stdout.split()

    def commands(self) -> list[str]:
        """The subcommands its `pdwarden --help` lists."""
        listed = self.run("pdwarden", "--help")
        if listed.returncode != 0:
            raise RuntimeError(f"`pdwarden --help` failed: {listed.stderr[-2000:]}")
        section = listed.stdout.split("Commands:", 1)[1].splitlines()
        return [line.split()[0] for line in section if line.startswith("  ") and not line.startswith("   ")]

    def size_mib(self) -> float:
        total = sum(p.stat().st_size for p in self.root.rglob("*") if p.is_file() and not p.is_symlink())
        return total / (1 << 20)


def base_packages(site: Path, into: Path, leave_out: tuple[str, ...]) -> Path:
    """A directory standing for a base image's packages: links to what `site` (a
    site-packages) holds, but the entries whose names start with one of `leave_out`."""
    into.mkdir(parents=True)
    for entry in site.iterdir():
        if not entry.name.startswith(leave_out) and entry.suffix != ".pth":
            (into / entry.name).symlink_to(entry)
    return into


def build(dockerfile: Path, scratch: Path, base: tuple[Path, ...] = ()) -> Environment:
    """The environment `dockerfile`'s pip steps make, in `scratch` (a new directory), over the
    base image's packages `base`."""
    text = dockerfile.read_text()
    context, root = scratch / "context", scratch / "venv"
    context.mkdir(parents=True)
    venv.EnvBuilder(with_pip=True, clear=True).create(root)
    if base:
        (purelib,) = root.glob("lib/python*/site-packages")
        (purelib / "_base_image.pth").write_text("".join(f"{b}\n" for b in base))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{root / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(root)
    workdir = Path("/")
    ran = []
    for step in steps(text):
        if step.instruction == "ARG" and "=" in step.argument:
            name, _, default = step.argument.partition("=")
            env[name] = default
        elif step.instruction == "ENV":
            # HOME and caches of the image stay the test's own
            env.update({k: v for k, v in _env(step).items() if k.startswith(("PIP_", "PYTHON"))})
        elif step.instruction == "WORKDIR":
            workdir = workdir / step.argument
        elif step.instruction == "COPY":
            *sources, dest = step.argument.split()
            target = context / (workdir / dest).relative_to("/")
            for source in sources:
                src = ROOT / source
                into = target / src.name if dest.endswith("/") else target
                if src.is_dir():
                    shutil.copytree(src, into, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
                else:
                    into.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(src, into)
        elif step.instruction == "RUN" and "pip install" in step.argument:
            cwd = context / workdir.relative_to("/")
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", step.argument],
                cwd=cwd,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            if done.returncode != 0:
                raise RuntimeError(f"`{step.argument}` failed ({done.returncode}): {done.stderr[-4000:]}")
            ran.append(step.argument)
    if not ran:
        raise ValueError(f"{dockerfile} has no `pip install` step")
    return Environment(root, tuple(ran))


def same_python(dockerfile: Path) -> bool:
    """Whether this Python is the minor version the Dockerfile's base image runs."""
    version = arg_default(dockerfile.read_text(), "PYTHON_VERSION") or ""
    return version.split(".")[:2] == [str(sys.version_info.major), str(sys.version_info.minor)]
