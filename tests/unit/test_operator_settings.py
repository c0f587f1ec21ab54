"""The operator's kopf settings: what it persists where, and which objects it streams at all."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, cast

import kopf
import pytest

import pdwarden_contract as contract
from pdwarden_operator import handlers
from pdwarden_operator.context import MEMO_KEY, OperatorContext
from tests.support.kube_client import UNREACHABLE_SERVER, unreachable_client

pytestmark = pytest.mark.unit


def _settings() -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    handlers.apply_settings(settings)
    return settings


@pytest.mark.parametrize(
    ("group", "version", "plural", "kind"),
    [(g, v, p, k) for g, v, p, _, k in handlers.CHILD_KINDS],
    ids=[k for *_, k in handlers.CHILD_KINDS],
)
def test_child_watches_are_filtered_by_the_api_server(
    group: str, version: str, plural: str, kind: str
) -> None:
    resource = kopf.Resource(group, version, plural, kind=kind, namespaced=True)
    selectors = list(_settings().watching.label_selectors.collect(resource))
    assert selectors == [f"{contract.LABEL_MANAGED_BY}={contract.MANAGED_BY}"]


@pytest.mark.parametrize(
    "resource",
    [
        kopf.Resource(contract.API_GROUP, contract.API_VERSION, contract.PLURAL, kind=contract.KIND),
        kopf.Resource("", "v1", "pods", kind="Pod"),
        kopf.Resource("rbac.authorization.k8s.io", "v1", "clusterroles", kind="ClusterRole"),
    ],
    ids=["DisaggregatedModel", "Pod", "ClusterRole"],
)
def test_other_resources_are_not_filtered(resource: kopf.Resource) -> None:
    # a user's DisaggregatedModel carries no pdwarden label: filtering it would hide it
    assert list(_settings().watching.label_selectors.collect(resource)) == []


def test_kopf_keeps_its_bookkeeping_out_of_our_label_and_status_space() -> None:
    settings = _settings()
    assert settings.persistence.finalizer == f"{contract.API_GROUP}/finalizer"
    assert isinstance(settings.persistence.diffbase_storage, kopf.AnnotationsDiffBaseStorage)
    assert isinstance(settings.persistence.progress_storage, kopf.AnnotationsProgressStorage)


@pytest.mark.parametrize(
    ("namespaces", "scope"),
    [([], [None]), (["team-a", "team-b"], ["team-a", "team-b"]), (["team-*"], [])],
)
def test_children_are_listed_before_start_where_the_operator_watches(
    namespaces: list[str], scope: list[str | None]
) -> None:
    # every namespace: one cluster-wide list per kind; globs: kopf resolves them, the watches fill
    context = OperatorContext.build(kube=unreachable_client())
    handlers.watch_scope(context, namespaces)
    assert context.prefill_scope == scope


def test_a_namespaced_kind_is_listed_across_namespaces_only_when_asked() -> None:
    from pdwarden_operator.kube.client import resource_path

    assert resource_path("apps/v1", "Deployment", None, all_namespaces=True) == "/apis/apps/v1/deployments"
    assert resource_path("apps/v1", "Deployment", "a") == "/apis/apps/v1/namespaces/a/deployments"
    for name in (None, "x"):  # an object always needs its namespace
        with pytest.raises(ValueError, match="namespace is required"):
            resource_path("apps/v1", "Deployment", None, name, all_namespaces=name is not None)


@pytest.mark.parametrize(
    ("namespace", "glob"), [("team-a", False), ("team-*", True), ("ns?", True), ("[ab]x", True), ("!x", True)]
)
def test_a_namespace_pattern_is_told_from_a_name(namespace: str, glob: bool) -> None:
    assert handlers.is_glob(namespace) is glob


def test_kopf_builds_no_diff_base_while_no_changing_handler_is_registered() -> None:
    # kopf builds it for every watch event of every object (a deep copy): pdwarden has no
    # create/update/resume handlers, so it is empty, until one is registered
    body = kopf.Body(cast(Any, {"metadata": {"name": "m", "annotations": {"a": "b"}}, "spec": {"x": 1}}))
    registry = kopf.OperatorRegistry()
    storage = handlers.DiffBaseWhenChanging(registry=registry, prefix=handlers.KOPF_PREFIX)
    assert storage.build(body=body) == {} and storage.fetch(body=body) is None

    @kopf.on.create("example.com", "v1", "things", registry=registry)
    def _changing(**_: object) -> None:
        pass

    assert storage.build(body=body)["spec"] == {"x": 1}
    assert isinstance(_settings().persistence.diffbase_storage, handlers.DiffBaseWhenChanging)
    assert not kopf.get_default_registry()._changing.get_all_handlers()  # the operator's: none


def test_kopf_logs_in_with_the_credentials_of_the_contexts_client() -> None:
    # one reader of the kubeconfig: kopf's watches and the operator's requests prove the same user
    context = OperatorContext.build(kube=unreachable_client())
    login = cast(Callable[..., Coroutine[Any, Any, kopf.ConnectionInfo]], handlers.login)
    info = asyncio.run(login(memo=kopf.Memo({MEMO_KEY: context})))
    assert info.server == context.kube.creds.server == UNREACHABLE_SERVER
    assert info.ca_path == str(context.kube.creds.ca_file)
