"""Engines behind a runtime pod's HTTP surface: ``synthetic`` (CPU, no model) and
``sglang`` (SGLang itself, with the NIXL hardening installed); their names are
``pdwarden_contract.ENGINES``."""
