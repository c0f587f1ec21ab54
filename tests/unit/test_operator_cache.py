"""The in-memory view fed by watch events (the child store and its resync queue), and the pure
bits of the API layer."""

from __future__ import annotations

import pytest

from pdwarden_operator import handlers
from pdwarden_operator.cache import ChildStore, ResyncQueue, owner_model
from pdwarden_operator.context import OperatorContext
from pdwarden_operator.kube.client import KubeApiError, resource_path
from tests.support.kube_client import unreachable_client

pytestmark = pytest.mark.unit


def _dm(name: str, ns: str = "ns") -> dict:
    return {"metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}"}, "spec": {}}


class Watched:
    """An operator context's child store and resync queue, fed as handlers.py feeds them (a
    model event without its full reconcile)."""

    def __init__(self) -> None:
        self.context = OperatorContext.build(kube=unreachable_client())
        self.store: ChildStore = self.context.children
        self.queue: ResyncQueue = self.context.resync

    def model_event(self, event_type: str | None, body: dict) -> None:
        if self.context.model_event(event_type, body) is not None:
            self.store.record(body)

    def child_event(self, api_version: str, kind: str, event_type: str, body: dict) -> tuple[str, str] | None:
        return handlers.child_event(self.context, api_version, kind, event_type, body)


def _child(name: str, owner: str | None, ns: str = "ns") -> dict:
    meta: dict = {"name": name, "namespace": ns, "managedFields": [{"manager": "x"}]}
    if owner:
        meta["ownerReferences"] = [
            {"apiVersion": "pdwarden.io/v1alpha1", "kind": "DisaggregatedModel", "name": owner, "uid": "u"}
        ]
    return {"metadata": meta, "spec": {"replicas": 1}}


def test_child_events_mark_their_model_dirty_and_keep_a_slim_copy() -> None:
    cache = Watched()
    cache.model_event(None, _dm("m"))
    assert cache.child_event("apps/v1", "Deployment", "ADDED", _child("m-prefill", "m")) == ("ns", "m")
    assert cache.queue.take_dirty() == [("ns", "m")]
    kid = cache.store.children_of(("ns", "m"))[("Deployment", "m-prefill")]
    assert kid["kind"] == "Deployment" and kid["apiVersion"] == "apps/v1"
    assert "managedFields" not in kid["metadata"]
    cache.child_event("apps/v1", "Deployment", "DELETED", _child("m-prefill", "m"))
    assert cache.store.children_of(("ns", "m")) == {}
    assert cache.queue.take_dirty() == [("ns", "m")]


def test_a_reader_gets_its_own_copy_of_a_child_as_the_watch_sent_it() -> None:
    """What a reader changes stays its own: the next reader gets the child as the watch sent it."""
    cache = Watched()
    cache.model_event(None, _dm("m"))
    sent = _child("m-prefill", "m")
    sent["status"] = {"replicas": 2, "conditions": [{"type": "Available", "status": "True"}]}
    cache.child_event("apps/v1", "Deployment", "MODIFIED", sent)
    first = cache.store.child(("ns", "m"), "Deployment", "m-prefill")
    assert first is not None and first["status"] == sent["status"] and first["spec"] == sent["spec"]
    first["status"]["conditions"].clear()
    first["spec"]["replicas"] = 9
    again = cache.store.children_of(("ns", "m"))[("Deployment", "m-prefill")]
    assert again["status"] == sent["status"] and again["spec"] == {"replicas": 1}
    assert cache.store.child(("ns", "m"), "Deployment", "m-decode") is None


def test_foreign_objects_and_unknown_models_are_ignored() -> None:
    cache = Watched()
    assert cache.child_event("apps/v1", "Deployment", "ADDED", _child("other", None)) is None
    cache.child_event("apps/v1", "Deployment", "ADDED", _child("x-prefill", "x"))
    assert cache.queue.take_dirty() == [], "no model x known: nothing to resync"
    assert owner_model(_child("a", "b", ns="n2")) == ("n2", "b")


def test_deleted_model_forgets_children_and_locks() -> None:
    cache = Watched()
    cache.model_event("ADDED", _dm("m"))
    cache.child_event("v1", "Service", "ADDED", _child("m-router", "m"))
    cache.store.lock(("ns", "m"))
    cache.model_event("DELETED", _dm("m"))
    assert (
        cache.store.children_of(("ns", "m")) == {}
        and cache.store.locks == {}
        and cache.queue.take_dirty() == []
    )


def test_mark_all_covers_every_known_model() -> None:
    cache = Watched()
    for n in ("a", "b"):
        cache.model_event(None, _dm(n))
    cache.queue.mark_all()
    assert sorted(cache.queue.take_dirty()) == [("ns", "a"), ("ns", "b")]
    assert not cache.queue.wake.is_set()


def test_a_periodic_pass_leaves_settled_ready_models_to_their_events() -> None:
    cache = Watched()
    for n in ("settled-ready", "settled-progressing", "unsettled-ready", "new"):
        cache.model_event(None, _dm(n))
    for n, phase in (
        ("settled-ready", "Ready"),
        ("settled-progressing", "Progressing"),
        ("unsettled-ready", "Ready"),
    ):
        cache.store.note_status(("ns", n), {"phase": phase})
    cache.store.note_settled(("ns", "settled-ready"), ("key",))
    cache.store.note_settled(("ns", "settled-progressing"), ("key",))
    cache.queue.mark_unsettled()
    assert sorted(k[1] for k in cache.queue.take_dirty()) == ["new", "settled-progressing", "unsettled-ready"]
    cache.child_event("apps/v1", "Deployment", "MODIFIED", _child("settled-ready-prefill", "settled-ready"))
    assert cache.queue.take_dirty() == [("ns", "settled-ready")]  # its events still reach it


def test_resource_paths() -> None:
    assert resource_path("apps/v1", "Deployment", "ns", "d") == "/apis/apps/v1/namespaces/ns/deployments/d"
    assert resource_path("v1", "Service", "ns") == "/api/v1/namespaces/ns/services"
    assert resource_path("v1", "Namespace", None, "ns") == "/api/v1/namespaces/ns"
    assert (
        resource_path("pdwarden.io/v1alpha1", "DisaggregatedModel", "n", "m")
        == "/apis/pdwarden.io/v1alpha1/namespaces/n/disaggregatedmodels/m"
    )
    with pytest.raises(ValueError, match="namespaced"):
        resource_path("apps/v1", "Deployment", None, "d")
    with pytest.raises(ValueError, match="does not know"):
        resource_path("v1", "PersistentVolumeClaim", "ns", "s")
    # the worker key's Secret is created by collection path (its name is generated)
    assert resource_path("v1", "Secret", "ns") == "/api/v1/namespaces/ns/secrets"


def test_error_classification() -> None:
    assert KubeApiError(503, "ServiceUnavailable", "").retriable
    assert KubeApiError(409, "Conflict", "").retriable
    assert KubeApiError(0, "ConnectionRefused", "").retriable
    assert not KubeApiError(422, "Invalid", "").retriable
    assert not KubeApiError(403, "Forbidden", "").retriable
    schema_error = KubeApiError(
        500, "InternalError", "failed to create typed patch object (x): field not declared"
    )
    assert not schema_error.retriable
    assert KubeApiError(404, "NotFound", "").not_found


def test_applied_children_and_written_status_are_known_at_once() -> None:
    cache = Watched()
    cache.model_event(None, {**_dm("m"), "status": {"phase": "Pending", "watchdog": {"lastScrape": "t"}}})
    applied = {**_child("m-decode", "m"), "apiVersion": "apps/v1", "kind": "Deployment"}
    cache.store.note_applied(("ns", "m"), [applied])
    assert ("Deployment", "m-decode") in cache.store.children_of(("ns", "m"))
    assert cache.queue.take_dirty() == [], "our own apply is not a reason to resync"
    cache.store.note_status(("ns", "m"), {"phase": "Ready"})
    assert cache.store.models[("ns", "m")]["status"] == {"phase": "Ready", "watchdog": {"lastScrape": "t"}}
    cache.store.note_applied(("ns", "gone"), [applied])
    assert cache.store.children_of(("ns", "gone")) == {}


def test_an_apply_response_never_replaces_what_the_watch_delivered() -> None:
    cache = Watched()
    cache.model_event(None, _dm("m"))
    watched = {**_child("m-decode", "m"), "status": {"observedGeneration": 1}}
    cache.child_event("apps/v1", "Deployment", "MODIFIED", watched)
    applied = {**_child("m-decode", "m"), "apiVersion": "apps/v1", "kind": "Deployment"}
    cache.store.note_applied(("ns", "m"), [applied])
    assert cache.store.children_of(("ns", "m"))[("Deployment", "m-decode")]["status"] == {
        "observedGeneration": 1
    }
