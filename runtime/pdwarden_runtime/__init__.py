"""pdwarden_runtime."""
