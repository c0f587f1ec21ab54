"""The `pdwarden` command: one click group whose subcommands live in their own packages.

Subcommands are imported lazily so that `pdwarden runtime serve` in a runtime image never
imports the operator (and `pdwarden cluster up` never imports torch).
"""

from __future__ import annotations

import importlib
from typing import Any

import click

# name -> "module:attribute" of a click command or group
SUBCOMMANDS: dict[str, str] = {
    "cluster": "pdwarden_localcluster.cli:cluster",
    "operator": "pdwarden_operator.cli:operator",
    "crd": "pdwarden_operator.cli:crd",
    "runtime": "pdwarden_runtime.cli:runtime",
    "bench": "pdwarden_bench.cli:bench",
    "demo": "pdwarden_cli.demo:demo",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = SUBCOMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        command: Any = getattr(importlib.import_module(module_name), attr)
        return command  # type: ignore[no-any-return]


@click.group(cls=LazyGroup)
@click.version_option(package_name="pdwarden")
def cli() -> None:
    """pdwarden: prefill/decode disaggregated SGLang on Kubernetes, without silent wedges."""


def main() -> None:
    cli()
