"""pdwarden_cli."""
