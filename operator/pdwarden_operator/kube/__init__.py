"""The only package of the operator that talks to the Kubernetes API.

credentials.py finds the API server and our credentials (kubeconfig or in-cluster);
client.py holds the connection and the error type; apply.py does
server-side apply, creates and plain reads; model_status.py is the single writer of
DisaggregatedModel status; pods.py lists, deletes and evicts runtime pods, and labels the
leader's own pod; events.py posts Events; lease.py reads and writes the leader-election
Lease; configmaps.py writes a model's list of gone runtime pods; scale.py reads and sets a
Deployment's count and marks the pod a scale-in removes; access.py reads the front proxy's
CA and asks SubjectAccessReviews for the external metrics API.
"""
