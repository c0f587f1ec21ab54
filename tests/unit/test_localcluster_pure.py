"""Pure pieces of the local cluster: go.mod replace lines, env resolution, addresses, pod status."""

from __future__ import annotations

import base64
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from pdwarden_localcluster import build, gomod, monitoring
from pdwarden_localcluster.kubelet import envvars, images, ipam, logserver
from pdwarden_localcluster.kubelet.container import ContainerRun
from pdwarden_localcluster.kubelet.podstatus import container_status, phase, pod_status
from pdwarden_localcluster.pki import Pki

pytestmark = pytest.mark.unit

KUBERNETES_GO_MOD = """module k8s.io/kubernetes

go 1.25.0

require (
	github.com/spf13/cobra v1.10.0
	go.etcd.io/etcd/server/v3 v3.6.5 // indirect
	k8s.io/api v0.0.0
	k8s.io/client-go v0.0.0
	k8s.io/klog/v2 v2.130.1
)

require k8s.io/kms v0.0.0 // indirect

replace (
	k8s.io/api => ./staging/src/k8s.io/api
	k8s.io/client-go => ./staging/src/k8s.io/client-go
	k8s.io/cri-api => ./staging/src/k8s.io/cri-api
)

replace k8s.io/kms => ./staging/src/k8s.io/kms
"""

OUR_GO_MOD = """// comment
module pdwarden.io/localcluster

go 1.25.0

require k8s.io/kubernetes v1.35.4
"""


def test_staging_modules_come_from_v0_requirements_and_staging_replaces() -> None:
    # cri-api is only replaced, kms only required on a one-line require; klog has a real version
    assert gomod.staging_modules(KUBERNETES_GO_MOD) == [
        "k8s.io/api",
        "k8s.io/client-go",
        "k8s.io/cri-api",
        "k8s.io/kms",
    ]


def test_rendered_go_mod_pins_every_staging_module_to_the_matching_v0_release() -> None:
    text = gomod.render_go_mod(OUR_GO_MOD, KUBERNETES_GO_MOD)
    assert text.startswith(OUR_GO_MOD.rstrip("\n"))
    assert "\tk8s.io/client-go => k8s.io/client-go v0.35.4\n" in text
    assert text.count("=> k8s.io/") == 4
    assert "klog" not in text.split("replace (", 1)[1]


def test_pinned_and_staging_versions() -> None:
    assert gomod.pinned_version(OUR_GO_MOD) == "v1.35.4"
    assert gomod.staging_version("v1.34.2") == "v0.34.2"
    with pytest.raises(ValueError, match=r"v1\.MINOR\.PATCH"):
        gomod.staging_version("v1.35.0-rc.1")
    with pytest.raises(ValueError, match="does not require"):
        gomod.pinned_version("module x\n")
    with pytest.raises(ValueError, match="no staging modules"):
        gomod.render_go_mod(OUR_GO_MOD, "module k8s.io/kubernetes\n")


def test_requirements_are_every_pin_of_a_go_mod_and_the_monitoring_pins_are_read_from_them() -> None:
    text = (
        "module pdwarden.io/x\n\ngo 1.25.0\n\nrequire a.io/one v1.2.3\n\nrequire (\n"
        "\tb.io/two v0.305.0 // indirect\n\tc.io/three v0.1.0\n)\n\nreplace (\n"
        "\ta.io/one => a.io/one v1.2.4\n)\n\ntool (\n\tb.io/two/cmd/two\n)\n"
        # an exclude block's lines look like requirements and are none
        "exclude (\n\td.io/four v0.9.0\n)\nretract v0.0.1\n"
    )
    assert gomod.requirements(text) == {"a.io/one": "v1.2.3", "b.io/two": "v0.305.0", "c.io/three": "v0.1.0"}
    # each of the monitoring stack's commands comes from a module pinned in go-monitoring
    assert build.monitoring_pin(build.MONITORING_MODULE).startswith("v0.")
    assert build.monitoring_pin(build.ALERTMANAGER_MODULE).startswith("v0.")
    with pytest.raises(ValueError, match="requires"):
        build.monitoring_pin("example.com/none")


def test_the_repository_pin_is_a_release_and_ldflags_carry_it() -> None:
    version = build.kubernetes_version()
    assert gomod.staging_version(version).startswith("v0.")
    flags = build.version_ldflags(version)
    assert f"-X k8s.io/component-base/version.gitVersion={version}" in flags
    assert f"gitMinor={version.split('.')[1]}" in flags


def test_the_build_key_names_the_version_and_changes_with_the_sources(tmp_path: Path, monkeypatch) -> None:
    key = build.build_key()
    assert key.startswith(f"k8s-{build.kubernetes_version()}-")
    fake = tmp_path / "go"
    (fake / "cmd").mkdir(parents=True)
    (fake / "go.mod").write_text(OUR_GO_MOD)
    (fake / "cmd" / "main.go").write_text("package main\n")
    monkeypatch.setattr(build, "GO_MODULE_DIR", fake)
    first = build.build_key()
    (fake / "cmd" / "main.go").write_text("package main // changed\n")
    assert build.build_key() != first


def test_a_missing_go_toolchain_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setattr(build.shutil, "which", lambda _name: None)
    monkeypatch.setattr(build, "GO_FALLBACK", Path("/nonexistent/go"))
    with pytest.raises(build.ClusterError, match="install Go"):
        build.go_binary()


# --- env ---------------------------------------------------------------------------------

POD = {
    "metadata": {
        "name": "p1",
        "namespace": "ns1",
        "uid": "u-1",
        "labels": {"app": "web"},
        "annotations": {"a": "b"},
    },
    "spec": {"nodeName": "node-0", "serviceAccountName": "sa"},
}
CTX = envvars.PodContext(pod=POD, pod_ip="127.0.1.5", host_ip="127.0.0.1", node_name="node-0")
SECRETS = {("ns1", "creds"): {"data": {"token": base64.b64encode(b"s3cret").decode()}}}
CONFIGMAPS = {("ns1", "cfg"): {"data": {"mode": "fast", "level": "3"}}}


def resolve(container: dict) -> dict[str, str]:
    return envvars.resolve_env(
        CTX,
        container,
        {"PATH": "/venv/bin:/usr/bin"},
        lambda n, k: SECRETS.get((n, k)),
        lambda n, k: CONFIGMAPS.get((n, k)),
    )


def test_expand_follows_kubernetes_rules() -> None:
    env = {"A": "1", "B": "two"}
    assert envvars.expand("$(A)-$(B)", env) == "1-two"
    assert envvars.expand("$(MISSING) $$(A) $$ $", env) == "$(MISSING) $(A) $ $"
    assert envvars.expand("$(A", env) == "$(A"


def test_env_resolution_covers_field_secret_and_configmap_refs() -> None:
    env = resolve(
        {
            "envFrom": [{"configMapRef": {"name": "cfg"}, "prefix": "CFG_"}],
            "env": [
                {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                {"name": "ANN", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['a']"}}},
                {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
                {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode"}}},
                {"name": "URL", "value": "http://$(IP):8080/$(MODE)"},
                {
                    "name": "OPT",
                    "valueFrom": {"secretKeyRef": {"name": "nope", "key": "x", "optional": True}},
                },
            ],
        }
    )
    assert env["POD_IP"] == env["IP"] == "127.0.1.5"
    assert (env["NAME"], env["NS"], env["APP"], env["ANN"]) == ("p1", "ns1", "web", "b")
    assert env["TOKEN"] == "s3cret" and env["MODE"] == "fast" and env["CFG_level"] == "3"
    assert env["URL"] == "http://127.0.1.5:8080/fast"
    assert "OPT" not in env
    assert env["PATH"] == "/venv/bin:/usr/bin"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"secretKeyRef": {"name": "nope", "key": "x"}}, 'Secret "nope" not found'),
        ({"secretKeyRef": {"name": "creds", "key": "x"}}, "couldn't find key x"),
        ({"configMapKeyRef": {"name": "cfg", "key": "x"}}, "couldn't find key x"),
        ({"fieldRef": {"fieldPath": "spec.bogus"}}, "unsupported fieldRef"),
    ],
)
def test_a_missing_reference_is_a_config_error(entry: dict, message: str) -> None:
    with pytest.raises(envvars.EnvError, match=message):
        resolve({"env": [{"name": "X", "valueFrom": entry}]})


def test_base_env_puts_the_venv_first_and_leaks_nothing_cluster_specific() -> None:
    env = envvars.base_env(
        {"HOME": "/root", "KUBECONFIG": "/admin", "PDWARDEN_STATE_DIR": "/s"}, "/repo/.venv/bin"
    )
    assert env["PATH"].startswith("/repo/.venv/bin:")
    assert env["HOME"] == "/root" and "KUBECONFIG" not in env and "PDWARDEN_STATE_DIR" not in env


def test_command_line_expands_and_requires_a_command() -> None:
    env = {"POD_IP": "127.0.1.9"}
    assert envvars.command_line({"command": ["srv"], "args": ["--host", "$(POD_IP)"]}, env) == [
        "srv",
        "--host",
        "127.0.1.9",
    ]
    with pytest.raises(envvars.EnvError, match="no `command`"):
        envvars.command_line({"args": ["x"]}, env)


def test_an_image_without_command_runs_its_entrypoint_only_at_the_tag_the_cluster_carries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary = tmp_path / "prometheus"
    binary.write_text("")
    known = images.KnownImage(
        "quay.io/prometheus/prometheus", "/bin/prometheus", lambda: "v2.42.0", lambda: binary
    )
    monkeypatch.setitem(images.KNOWN_IMAGES, known.repository, known)
    env = {"POD_IP": "198.18.0.9"}
    container = {
        "image": "quay.io/prometheus/prometheus:v2.42.0",
        "args": ["--web.listen-address=$(POD_IP):9090"],
    }
    assert envvars.command_line(container, env) == [str(binary), "--web.listen-address=198.18.0.9:9090"]
    # the image's own path for its binary stands for that binary; any other command is the host's
    named = {**container, "command": ["/bin/prometheus"]}
    assert envvars.command_line(named, env)[0] == str(binary)
    assert envvars.command_line({**container, "command": ["sh", "-c", "x"]}, env)[:2] == ["sh", "-c"]
    # another tag, a digest, no tag: a different binary than the one the cluster has
    for ref in (
        "quay.io/prometheus/prometheus:v3.5.0",
        "quay.io/prometheus/prometheus@sha256:" + "0" * 64,
        "quay.io/prometheus/prometheus",
    ):
        with pytest.raises(envvars.EnvError, match=r"carries quay\.io/prometheus/prometheus:v2\.42\.0 only"):
            envvars.command_line({"image": ref}, env)
    binary.unlink()
    with pytest.raises(envvars.EnvError, match="is missing"):
        envvars.command_line(container, env)


def test_image_references_split_into_repository_and_tag() -> None:
    assert images.split_reference("quay.io/prometheus/alertmanager:v0.25.0") == (
        "quay.io/prometheus/alertmanager",
        "v0.25.0",
    )
    assert images.split_reference("localhost:5000/app") == ("localhost:5000/app", "")
    assert images.split_reference("localhost:5000/app:1.2") == ("localhost:5000/app", "1.2")
    assert images.split_reference("app:1@sha256:ab") == ("app", "")
    # the tags the cluster carries are the Go pins' releases
    assert build.prometheus_release("v0.305.0") == "v3.5.0"
    assert build.prometheus_release("v0.310.2") == "v3.10.2"
    assert build.prometheus_release("v0.45.1") == "v2.45.1"
    assert images.reference(images.CONFIG_RELOADER_IMAGE) == (
        f"quay.io/prometheus-operator/prometheus-config-reloader:{build.prometheus_operator_version()}"
    )
    assert images.PROMETHEUS_IMAGE.version() == build.prometheus_release(
        build.monitoring_pin(build.PROMETHEUS_MODULE)
    )


# --- pod IPs -------------------------------------------------------------------------------


def test_pod_ips_are_distinct_addresses_of_the_node_subnet_past_its_bridge() -> None:
    alloc = ipam.IpAllocator("198.18.16.0/24")
    ips = [alloc.allocate(f"pod-{i}") for i in range(alloc.capacity)]
    assert len(set(ips)) == alloc.capacity == 253
    assert all(ip.startswith("198.18.16.") for ip in ips)
    assert "198.18.16.1" not in ips and "198.18.16.255" not in ips  # bridge, broadcast
    assert alloc.allocate("pod-3") == ips[3]  # the same owner keeps its address
    with pytest.raises(RuntimeError, match=r"no free pod IP in 198\.18\.16\.0/24"):
        alloc.allocate("one-too-many")


def test_a_released_ip_is_not_reused_at_once_and_a_preferred_one_is_kept() -> None:
    alloc = ipam.IpAllocator("198.18.16.0/24")
    first = alloc.allocate("a")
    alloc.release("a")
    assert alloc.allocate("b") != first
    assert alloc.allocate("c", preferred="198.18.16.99") == "198.18.16.99"
    assert alloc.allocate("d", preferred="198.18.16.99") != "198.18.16.99"  # taken
    assert alloc.allocate("e", preferred="198.18.17.5").startswith("198.18.16.")  # another node's


# --- pod status ------------------------------------------------------------------------------


def run(tmp_path: Path, **state) -> ContainerRun:
    r = ContainerRun("c", {"name": "c"}, tmp_path)
    for key, value in state.items():
        setattr(r, key, value)
    return r


def test_phase_follows_containers_and_restart_policy(tmp_path: Path) -> None:
    ok = {"exitCode": 0, "reason": "Completed"}
    bad = {"exitCode": 1, "reason": "Error"}
    assert phase([run(tmp_path)], "Always", True) == "Pending"
    assert phase([run(tmp_path, attempts=1, terminated=ok)], "Never", True) == "Succeeded"
    assert phase([run(tmp_path, attempts=1, terminated=bad)], "Never", True) == "Failed"
    assert phase([run(tmp_path, attempts=1, terminated=bad)], "OnFailure", True) == "Running"
    assert phase([run(tmp_path, attempts=1, terminated=ok)], "OnFailure", True) == "Succeeded"
    assert phase([run(tmp_path, attempts=1, terminated=ok)], "Always", True) == "Running"
    assert phase([run(tmp_path, attempts=1, terminated=ok)], "Never", False) == "Pending"


def test_a_crash_looping_container_reports_waiting_with_the_last_termination(tmp_path: Path) -> None:
    start_error = {"exitCode": 128, "reason": "StartError", "message": "exec: 'x': not found"}
    r = run(tmp_path, attempts=2, restart_count=1, terminated=start_error, waiting_reason="CrashLoopBackOff")
    status = container_status(r, "img")
    assert status["state"] == {"waiting": {"reason": "CrashLoopBackOff"}}
    assert status["lastState"] == {"terminated": start_error}
    assert status["restartCount"] == 1 and status["ready"] is False
    final = container_status(run(tmp_path, attempts=1, terminated=start_error, waiting_reason=""), "img")
    assert final["state"] == {"terminated": start_error}


def test_pod_conditions_keep_transition_times_and_podscheduled(tmp_path: Path) -> None:
    scheduled = {"type": "PodScheduled", "status": "True", "lastTransitionTime": "t0"}
    pod = {"spec": {"containers": [{"name": "c", "image": "img"}]}, "status": {"conditions": [scheduled]}}
    r = run(tmp_path, attempts=1, terminated={"exitCode": 0, "reason": "Completed"})
    first = pod_status(pod, [], [r], "127.0.1.1", "127.0.0.1", "t", True, True, "t1")
    again = pod_status({**pod, "status": first}, [], [r], "127.0.1.1", "127.0.0.1", "t", True, True, "t2")
    by_type = {c["type"]: c for c in again["conditions"]}
    assert by_type["PodScheduled"] == scheduled
    assert by_type["Ready"]["lastTransitionTime"] == "t1"  # unchanged status keeps its time
    assert again["podIP"] == "127.0.1.1" and again["podIPs"] == [{"ip": "127.0.1.1"}]


def test_kubectl_logs_shows_one_run_without_kubelet_markers() -> None:
    data = (
        b'--- pdwarden kubelet: starting ["a"] at t0\n'
        b"first run\n"
        b"--- pdwarden kubelet: exited with 1 at t1\n"
        b'--- pdwarden kubelet: starting ["a"] at t2\n'
        b"second run 1\nsecond run 2\n"
    )
    assert logserver.select_run(data, previous=False) == b"second run 1\nsecond run 2\n"
    assert logserver.select_run(data, previous=True) == b"first run\n"
    assert logserver.select_run(data[:60], previous=True) == b""
    assert logserver.tail(b"a\nb\nc\n", 2) == b"b\nc\n"
    assert logserver.tail(b"a\nb\n", None) == b"a\nb\n"


def test_cluster_addresses_lie_in_the_benchmarking_range_and_differ_per_port_base() -> None:
    import ipaddress

    from pdwarden_localcluster import network
    from pdwarden_localcluster.cluster import DEFAULT_PORT_BASE, Ports

    whole = ipaddress.ip_network(network.BENCHMARK_RANGE)
    plans = [Ports(base).net for base in (DEFAULT_PORT_BASE, 22000, 36500)]
    assert len({p.slot for p in plans}) == 3
    for p in plans:
        nets = [p.pod_cidr, p.service_cidr, *(p.node_subnet(i) for i in range(network.MAX_NODES))]
        assert all(ipaddress.ip_network(n).subnet_of(whole) for n in nets)  # type: ignore[arg-type]
        for addr in (p.host_addr, p.gateway_addr, p.kubernetes_service_ip, p.dns_service_ip):
            assert ipaddress.ip_address(addr) in whole
        assert ipaddress.ip_address(p.kubernetes_service_ip) in ipaddress.ip_network(p.service_cidr)
        assert ipaddress.ip_address(p.host_addr) in ipaddress.ip_network(p.pod_cidr)
        assert p.node_gateway(0) == str(ipaddress.ip_network(p.node_subnet(0)).network_address + 1)
        assert len(p.host_link) <= 15 and p.gateway_netns.startswith(p.prefix)
    a, b = plans[0], plans[1]
    assert not ipaddress.ip_network(a.pod_cidr).overlaps(ipaddress.ip_network(b.pod_cidr))
    assert not ipaddress.ip_network(a.service_cidr).overlaps(ipaddress.ip_network(b.service_cidr))
    assert a.host_link != b.host_link and not b.is_mine(a.gateway_netns)
    with pytest.raises(ValueError, match="node index 15"):
        a.node_subnet(network.MAX_NODES)
    assert len(network.pod_veth("198.18.255.254")) <= 15


def test_kubelet_fingerprint_follows_the_interpreter_so_another_checkout_restarts_it() -> None:
    from pdwarden_localcluster.cluster import kubelet_fingerprint

    here = kubelet_fingerprint()
    assert kubelet_fingerprint(sys.executable) == here
    # one environment whichever name of its interpreter ran `up` (`python -m`, a script's shebang)
    for name in ("python", "python3", f"python{sys.version_info.major}.{sys.version_info.minor}"):
        assert kubelet_fingerprint(str(Path(sys.executable).with_name(name))) == here
    # a cluster started from another checkout's .venv would run that checkout's code in pods
    assert kubelet_fingerprint("/elsewhere/.venv/bin/python3") != here


def _apiserver_args(root: Path, pki: Pki) -> list[str]:
    from pdwarden_localcluster import cluster

    lay = SimpleNamespace(root=root)
    return cluster._apiserver_args(root, lay, pki, cluster.Ports(cluster.DEFAULT_PORT_BASE))  # type: ignore[arg-type]


def test_the_api_server_enforces_owner_reference_permissions(tmp_path: Path) -> None:
    args = _apiserver_args(tmp_path, Pki(tmp_path))
    plugins = next(a for a in args if a.startswith("--enable-admission-plugins="))
    assert "OwnerReferencesPermissionEnforcement" in plugins.split("=", 1)[1].split(",")


def test_the_aggregation_layer_trusts_a_front_proxy_ca_of_its_own(tmp_path: Path) -> None:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    from pdwarden_localcluster.pki import FRONT_PROXY_CLIENT, ensure_pki

    pki = ensure_pki(tmp_path / "pki", ["198.18.143.1"])
    assert pki.complete()
    args = dict(a.removeprefix("--").split("=", 1) for a in _apiserver_args(tmp_path, pki) if "=" in a)
    assert args["requestheader-client-ca-file"] == str(pki.front_proxy_ca_cert)
    assert args["requestheader-allowed-names"] == FRONT_PROXY_CLIENT
    assert args["proxy-client-cert-file"] == str(pki.front_proxy_client_cert)
    assert args["requestheader-username-headers"] == "X-Remote-User"
    proxy = x509.load_pem_x509_certificate(pki.front_proxy_client_cert.read_bytes())
    front_ca = x509.load_pem_x509_certificate(pki.front_proxy_ca_cert.read_bytes())
    cluster_ca = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    proxy.verify_directly_issued_by(front_ca)
    assert proxy.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == FRONT_PROXY_CLIENT
    # no other client cert of the cluster can name a caller to an extension API server
    assert front_ca.subject != cluster_ca.subject
    admin = x509.load_pem_x509_certificate(pki.client_cert("admin").read_bytes())
    with pytest.raises(ValueError):  # another issuer
        admin.verify_directly_issued_by(front_ca)


def test_pods_resolve_through_the_clusters_dns_service_and_search_their_namespace_first() -> None:
    from pdwarden_localcluster import network
    from pdwarden_localcluster.kubelet import dns

    net = network.plan(22000)
    resolv = dns.resolv_conf(net, "shop")
    assert resolv.splitlines()[0] == f"nameserver {net.dns_service_ip}"
    assert "search shop.svc.cluster.local svc.cluster.local cluster.local" in resolv
    svc, eps = dns.service(net), dns.endpoint_slice(net)
    assert svc["spec"]["clusterIP"] == net.dns_service_ip and "selector" not in svc["spec"]
    assert eps["endpoints"][0]["addresses"] == [net.host_addr]
    assert eps["metadata"]["labels"]["kubernetes.io/service-name"] == svc["metadata"]["name"]
    corefile = dns.corefile(net.host_addr, Path("/k"))
    assert f"bind {net.host_addr}" in corefile and "kubeconfig /k" in corefile
    assert "forward" not in corefile  # no query leaves the machine


def test_kube_proxy_is_configured_for_the_clusters_pod_range_on_loopback_ports() -> None:
    from pdwarden_localcluster import network
    from pdwarden_localcluster.kubelet import proxy

    net = network.plan(22000)
    cfg = proxy.config(Path("/k"), "pdwarden-node-0", net, 22256, 22249)
    assert cfg["mode"] == "nftables" and cfg["clusterCIDR"] == net.pod_cidr
    assert cfg["healthzBindAddress"] == "127.0.0.1:22256" and cfg["metricsBindAddress"] == "127.0.0.1:22249"


def test_a_missing_executable_is_an_os_error_before_any_prefix_runs(tmp_path: Path) -> None:
    from pdwarden_localcluster.kubelet.container import resolve_executable

    script = tmp_path / "tool"
    script.write_text("#!/bin/sh\n")
    with pytest.raises(PermissionError):
        resolve_executable(str(script), "")
    script.chmod(0o755)
    assert resolve_executable("tool", str(tmp_path)) == str(script)
    with pytest.raises(FileNotFoundError):
        resolve_executable("no-such-tool", str(tmp_path))


def test_the_monitoring_stack_selects_every_monitor_and_rule_and_runs_the_images_the_cluster_carries() -> (
    None
):
    docs = {d["kind"]: d for d in monitoring.stack_manifests()}
    prometheus = docs["Prometheus"]["spec"]
    for selector in ("podMonitor", "serviceMonitor", "rule"):
        assert prometheus[f"{selector}Selector"] == {} and prometheus[f"{selector}NamespaceSelector"] == {}
    assert prometheus["image"] == images.reference(images.PROMETHEUS_IMAGE)
    assert prometheus["version"] == images.PROMETHEUS_IMAGE.version()
    (target,) = prometheus["alerting"]["alertmanagers"]
    assert (target["namespace"], target["name"]) == (monitoring.NAMESPACE, monitoring.ALERTMANAGER_SERVICE)
    assert docs["Alertmanager"]["spec"]["image"] == images.reference(images.ALERTMANAGER_IMAGE)
    # every image of the stack is one the local kubelet knows at its tag
    for image in (prometheus["image"], docs["Alertmanager"]["spec"]["image"]):
        assert images.known_image(image) is not None
