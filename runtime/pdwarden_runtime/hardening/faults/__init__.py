"""Fault modes of the hardened NIXL classes, for tests and the demo only.

A fault is switched at run time (``HardeningConfig.fault``, ``POST /debug/fault`` behind
``--allow-fault-injection``) and runs through SGLang's own code, so a test sees what a real
failure would do. Each module here is one fault's machinery; ``nixl.py`` asks the switch
which one is on and calls into it. Nothing here runs while the switch says ``none``.

- ``port_race``: ``emulated-maxstatus-port-race``, the emulated NIXL port's ABORT race.
- ``stalled_agent``: ``stall-kv-receive`` (decode), a NIXL agent that never progresses.
- ``stall-transfers`` (every handle looks unsettled) and ``drop-abort`` (ABORTs from decode
  are dropped) need no state: ``nixl.py`` reads the switch where they act.
"""
