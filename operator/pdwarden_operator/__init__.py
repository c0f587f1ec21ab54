"""pdwarden_operator."""
