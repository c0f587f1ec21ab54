"""The only package of the operator that talks to the Kubernetes API.

client.py holds the connection (kubeconfig or in-cluster) and the error type; apply.py does
server-side apply and plain reads; status.py is the single writer of DisaggregatedModel status.
"""
