"""pdwarden_bench."""
