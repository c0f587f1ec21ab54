"""pdwarden_cli: the `pdwarden` command, whose subcommands the installed distributions register."""
