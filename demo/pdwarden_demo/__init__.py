"""pdwarden_demo: `pdwarden demo`, a new user's first minutes on the local cluster (part of the
development distribution: never shipped in an image)."""
