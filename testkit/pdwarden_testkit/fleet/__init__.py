"""A simulated fleet: thousands of runtime pods on the local cluster without their processes.

One process (`python -m pdwarden_testkit.fleet`) registers a Node of its own, tainted so
that only pods which ask for it land there (`placement.py`), marks every pod bound to it
Running and Ready with an address of its own, confirms their deletion, and answers every
pod's /metrics with what a real runtime of the pod's role exports (`runtimes.py`: the
runtime's own metrics code over real room tables). The operator, the controllers and the
scheduler see real pods; only the processes are missing. Benchmarks of the watchdog's real
round and the tests of this kit use it; nothing it holds ships in an image.
"""
