"""pdwarden's test kit: what the tests, the benchmarks and the demo share to drive the local
cluster and the runtime's processes (kubectl, the cluster harness, operator and runtime
processes, port shares). Part of the development distribution only; no image installs it.

Layers: it uses the local cluster (``pdwarden_localcluster``, whose ``waits`` is the one way
to wait), the product packages and the contract; the benchmarks and the demo use it; nothing
here imports a benchmark or the demo.
"""
