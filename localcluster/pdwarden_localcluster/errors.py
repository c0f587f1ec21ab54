"""The one error type the local cluster raises for problems a user can fix.

The CLI prints its message (which names the fix) without a stack trace.
"""

from __future__ import annotations


class ClusterError(Exception):
    """A problem with the local cluster that the user can act on; the message says how."""
