"""pdwarden_localcluster."""
