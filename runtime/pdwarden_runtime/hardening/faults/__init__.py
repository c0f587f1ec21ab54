"""Fault modes of the hardened NIXL classes, for tests and the demo only.

A fault is switched at run time (``HardeningConfig.fault``, ``POST /debug/fault`` behind
``--allow-fault-injection``) and runs through SGLang's own code, so a test sees what a real
failure would do. The hardened classes call the active fault's hooks (``hooks.Faults``)
unconditionally: ``fault_set.FaultSet.active()`` names them, and with the switch at ``none``
that is ``NO_FAULTS``, whose hooks do nothing. Each module here is one fault:

- ``port_race``: ``emulated-maxstatus-port-race``, the emulated NIXL port's ABORT race.
- ``stall_transfers``: ``stall-transfers``, every handle looks unsettled (quarantine too).
- ``drop_abort``: ``drop-abort``, ABORTs from decode are dropped.
- ``stalled_agent``: ``stall-kv-receive`` (decode), a NIXL agent that never progresses.
"""
