"""What `cluster down` looks for besides recorded processes (pure parts, on fake inputs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdwarden_localcluster import teardown

pytestmark = pytest.mark.unit

MOUNTINFO = """\
22 1 0:21 / / rw,relatime - overlay overlay rw
35 22 0:33 / /state/pods/ns_web_1234/vol rw - tmpfs tmpfs rw,size=65536k
36 22 0:34 / /state/pods/ns_web_1234/vol/inner rw - tmpfs tmpfs rw
37 22 0:35 / /state2/pods/x rw - tmpfs tmpfs rw
38 22 0:36 / /state/pods/with\\040space rw - tmpfs tmpfs rw
"""


def test_mounts_under_the_state_dir_are_found_deepest_first_and_unescaped() -> None:
    assert teardown.mounts_under(Path("/state"), MOUNTINFO) == [
        Path("/state/pods/with space"),
        Path("/state/pods/ns_web_1234/vol/inner"),
        Path("/state/pods/ns_web_1234/vol"),
    ]
    assert teardown.mounts_under(Path("/elsewhere"), MOUNTINFO) == []


def test_a_process_belongs_to_the_cluster_only_if_a_program_of_it_names_the_state_dir() -> None:
    state = Path("/s/wt")
    apiserver = b"/bin/k8s/kube-apiserver\0--cert-dir=/s/wt/pki/generated\0"
    kubelet = b"/venv/bin/python\0-m\0pdwarden_localcluster.kubelet\0--state-dir=/s/wt\0"
    coredns = b"/bin/pdwarden-coredns\0-conf\0/s/wt/coredns/Corefile\0"
    assert all(
        teardown.is_cluster_program(c) and teardown.names_state_dir(c, state)
        for c in (apiserver, kubelet, coredns)
    )
    other_cluster = b"/bin/k8s/kube-apiserver\0--cert-dir=/s/wt2/pki/generated\0"
    assert not teardown.names_state_dir(other_cluster, state), "a sibling whose name starts the same"
    editor = b"vim\0/s/wt/logs/kubelet.log\0"
    assert teardown.names_state_dir(editor, state) and not teardown.is_cluster_program(editor)


def test_the_clusters_cgroups_are_found_at_any_depth_and_removed_deepest_first(tmp_path: Path) -> None:
    name = teardown.cgroup_name(Path("/x/wt-nodes"))
    assert name.startswith("pdwarden-wt-nodes-")
    assert teardown.cgroup_name(Path("/y/wt-nodes")) != name, "two clusters' state dirs of one name"
    deep = tmp_path / "user.slice" / "session-1.scope" / name / "podabc" / "web"
    deep.mkdir(parents=True)
    (tmp_path / "system.slice" / "pdwarden-other").mkdir(parents=True)
    assert teardown.cgroup_dirs(name, tmp_path) == [deep.parent.parent]
    removed = teardown.remove_cgroups(name, tmp_path)
    assert removed == [f"cgroup {deep.parent.parent}"]
    assert not deep.parent.parent.exists() and (tmp_path / "system.slice" / "pdwarden-other").exists()


def test_mount_points_made_on_the_host_go_at_teardown_unless_they_gained_content(tmp_path: Path) -> None:
    state, host = tmp_path / "state", tmp_path / "host"
    state.mkdir()
    (host / "models" / "llama").mkdir(parents=True)  # made for /models/llama
    (host / "etc-app").touch()  # a file mount point
    (host / "cache" / "hub").mkdir(parents=True)
    (host / "cache" / "hub" / "weights").write_text("someone's data since")
    log = state / teardown.CREATED_MOUNT_POINTS
    log.write_text("".join(f"{host / n}\n" for n in ("models", "etc-app", "cache", "models", "gone")))
    assert set(teardown.created_mount_points(state)) == {host / "models", host / "etc-app"}
    removed = teardown.remove_created_mount_points(state)
    assert sorted(removed) == sorted([f"mount point {host / 'models'}", f"mount point {host / 'etc-app'}"])
    assert not (host / "models").exists() and not (host / "etc-app").exists()
    assert (host / "cache" / "hub" / "weights").read_text() == "someone's data since"
    assert not log.exists() and teardown.created_mount_points(state) == []
