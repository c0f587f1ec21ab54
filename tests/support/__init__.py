"""Harnesses shared by the tests (the e2e watchdog scenarios' cluster access and load)."""
