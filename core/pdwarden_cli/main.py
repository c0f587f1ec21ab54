"""The `pdwarden` command: one click group whose subcommands come from the installed
distributions (entry points in the `pdwarden.commands` group).

Each distribution registers its own: pdwarden-operator `operator` and `crd`, pdwarden-runtime
`runtime`, pdwarden-dev `cluster`, `bench` and `demo`. A subcommand is imported only when it
runs, so `pdwarden runtime serve` never imports the operator (and `pdwarden cluster up` never
imports torch); an image has only the subcommands of what it installs.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points
from typing import Any

import click

COMMANDS_GROUP = "pdwarden.commands"


def installed_commands() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=COMMANDS_GROUP)}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(installed_commands())

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        found = installed_commands().get(cmd_name)
        if found is None:
            return None
        command: Any = found.load()
        return command  # type: ignore[no-any-return]


@click.group(cls=LazyGroup)
@click.version_option(package_name="pdwarden")
def cli() -> None:
    """pdwarden: prefill/decode disaggregated SGLang on Kubernetes, without silent wedges."""


def main() -> None:
    cli()
