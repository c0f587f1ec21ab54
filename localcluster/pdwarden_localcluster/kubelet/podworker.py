"""One thread per pod: start its containers, probe, restart, report status, stop on deletion."""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdwarden_localcluster.errors import ClusterError
from pdwarden_localcluster.kubeapi import ApiError, KubeApi
from pdwarden_localcluster.kubelet import cgroups, dns, envvars, podnet, refusal, security, streaming, volumes
from pdwarden_localcluster.kubelet.backoff import BackOff
from pdwarden_localcluster.kubelet.container import ContainerRun, kill_recorded, utc_now
from pdwarden_localcluster.kubelet.ipam import IpAllocator
from pdwarden_localcluster.kubelet.podstatus import pod_status, will_restart
from pdwarden_localcluster.kubelet.probes import ProbeState, now, run_probe
from pdwarden_localcluster.network import NetPlan
from pdwarden_localcluster.paths import REPO_ROOT
from pdwarden_localcluster.teardown import CREATED_MOUNT_POINTS, cgroup_name

JSON = dict[str, Any]
log = logging.getLogger("pdwarden.kubelet")

TICK = 0.25
RETRY_S = 2.0  # a volume or config that is not there yet is looked at again this often
# Paths a non-root container must be able to traverse to reach the project's interpreter and
# venv (an image's own files would be readable by its user).
TRAVERSABLE = ("/root",)
# What every container runs from (a cluster's image): the checkout with its venv, and the
# interpreter the venv is made from. A volume mounted over a directory holding them leaves
# them visible (sandbox.py).
IMAGE_PATHS = (str(REPO_ROOT), os.path.realpath(sys.base_prefix))
NSENTER = "nsenter"
BACKOFF = BackOff()
SANDBOX = [sys.executable, "-m", "pdwarden_localcluster.kubelet.sandbox"]


@dataclass(frozen=True)
class KubeletConfig:
    node_ip: str
    state_dir: Path
    venv_bin: str
    server: str
    ca_file: Path
    host_env: dict[str, str]
    backoff: BackOff = BACKOFF
    pod_server: str = ""  # the API server's URL as pods in their own namespaces reach it
    net: NetPlan | None = None  # None: pods share the host's network namespace
    cluster_dns: bool = False  # pods (dnsPolicy ClusterFirst) resolve through kube-dns


def pod_dir_name(pod: JSON) -> str:
    meta = pod.get("metadata", {})
    return f"{meta.get('namespace')}_{meta.get('name')}_{str(meta.get('uid', ''))[:8]}"


class PodWorker(threading.Thread):
    def __init__(
        self,
        api: KubeApi,
        cfg: KubeletConfig,
        ips: IpAllocator,
        node_name: str,
        pod: JSON,
        node_index: int = 0,
    ) -> None:
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['namespace']}/{meta['name']}", daemon=True)
        self.api, self.cfg, self.ips, self.node_name = api, cfg, ips, node_name
        self.uid: str = meta["uid"]
        self.namespace: str = meta["namespace"]
        self.pod_name: str = meta["name"]
        self._pod = pod
        self._lock = threading.Lock()
        self._gone = threading.Event()
        self._shutdown = threading.Event()
        self.finished = threading.Event()
        self.pod_dir = cfg.state_dir / "pods" / pod_dir_name(pod)
        spec = pod.get("spec", {})
        self.init_runs = [
            ContainerRun(c["name"], c, self.pod_dir, init=True) for c in spec.get("initContainers") or []
        ]
        self.runs = [ContainerRun(c["name"], c, self.pod_dir) for c in spec.get("containers") or []]
        _carry_restart_counts(pod, self.runs)
        self.pod_ip = ""
        self.node_index = node_index
        self.net: podnet.PodNet | None = None
        self.start_time = (pod.get("status") or {}).get("startTime") or utc_now()
        self.sandbox_error = ""
        self.refused: list[refusal.Refusal] | None = None
        self.volumes = volumes.PodVolumes(self.pod_dir, api.get_or_none, api.post, self._context(pod))
        self.volume_error = ""
        self.volume_retry_at = 0.0
        self.evicted = ""  # the eviction message, once a disk emptyDir went over its sizeLimit
        self.cgroups = cgroups.Cgroups(cgroup_name(cfg.state_dir))
        self.oom_at_start: dict[str, int] = {}
        self._cgroup_procs: list[Path] = []
        self.events_sent: set[str] = set()
        self.last_status: JSON | None = None
        self.terminating_since: float | None = None
        self.backoff_counts: dict[str, int] = {}
        self.frozen = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")

    # --- called from the watch thread -------------------------------------------------
    def update(self, pod: JSON) -> None:
        with self._lock:
            self._pod = pod

    def gone(self) -> None:
        self._gone.set()

    def shutdown(self) -> None:
        """The kubelet is stopping: kill the processes, leave the API alone."""
        self._shutdown.set()

    @property
    def pod(self) -> JSON:
        with self._lock:
            return self._pod

    # --- the loop ---------------------------------------------------------------------
    def run(self) -> None:
        try:
            self._setup()
            while True:
                if self._shutdown.is_set() or self._gone.is_set():
                    self._stop_all(grace=2.0 if self._gone.is_set() else 5.0)
                    break
                pod = self.pod
                try:
                    if (pod.get("metadata") or {}).get("deletionTimestamp"):
                        if self._terminate_step(pod):
                            break
                    elif not self.frozen:
                        self._step(pod)
                    self._report(pod)
                except ApiError as exc:
                    if exc.status == 404:
                        self._gone.set()
                    else:  # e.g. the apiserver restarting: retry, but do not spin
                        log.warning("%s: API error: %s", self.name, exc)
                        time.sleep(1.0)
                except Exception:  # one bad pod must never take the kubelet down
                    log.exception("%s: unexpected error; continuing", self.name)
                time.sleep(TICK)
        except Exception:
            log.exception("%s: worker failed", self.name)
            self._stop_all(grace=1.0)
        finally:
            if self.net is not None:
                podnet.teardown(self.net)
            self.ips.release(self.uid)
            self.finished.set()

    def _setup(self) -> None:
        self.pod_dir.mkdir(parents=True, exist_ok=True)
        for pid_file in self.pod_dir.glob("*.pid"):  # processes of an earlier kubelet
            kill_recorded(pid_file)
        pod = self.pod
        spec = pod.get("spec") or {}
        if spec.get("hostNetwork") or self.cfg.net is None:
            self.pod_ip = self.cfg.node_ip
            return
        ip = self.ips.allocate(self.uid, preferred=(pod.get("status") or {}).get("podIP"))
        resolv = ""
        if self.cfg.cluster_dns and spec.get("dnsPolicy", "ClusterFirst") != "Default":
            resolv = dns.resolv_conf(self.cfg.net, self.namespace)
        hostname = spec.get("hostname") or self.pod_name
        net = podnet.PodNet(self.cfg.net, self.node_index, self.uid, ip, hostname, resolv)
        try:
            podnet.setup(net)
        except ClusterError as exc:
            self.sandbox_error = f"cannot set up the pod's network namespace: {exc}"
            log.error("%s: %s", self.name, self.sandbox_error)
            return
        self.net, self.pod_ip = net, ip

    def _exec_prefix(self) -> list[str]:
        return self.net.exec_prefix() if self.net is not None else []

    def _probe_prefix(self, run: ContainerRun) -> list[str]:
        """An exec probe runs in the container's namespaces, as its user."""
        if run.proc is None:
            return self._exec_prefix()
        uid, gid = run.user
        return [NSENTER, f"--target={run.proc.pid}", "--mount", "--net", f"--setuid={uid}", f"--setgid={gid}"]

    def _run_probe(self, probe: JSON, run: ContainerRun, cwd: str) -> tuple[bool, str]:
        return run_probe(
            probe, run.spec, self.pod_ip, run.env, cwd, self._probe_prefix(run), self._probe_netns()
        )

    def _probe_netns(self) -> str | None:
        """The kubelet's own probe connections leave from the gateway namespace: it holds the
        nodes' network stack (their bridges), as a node's own stack holds a kubelet's. There
        kube-network-policies lets a node's root-owned traffic to pods through, as on a node;
        sent from the host, a probe would come in as a stranger's and meet the pod's policies."""
        return self.net.plan.gateway_netns if self.net is not None else None

    # --- running ----------------------------------------------------------------------
    def _step(self, pod: JSON) -> None:
        if self.evicted:
            for run in self.init_runs + self.runs:
                run.poll()  # SIGKILL once the grace is over; the exit is recorded, not restarted
            return
        if not self._admit(pod) or not self._ensure_volumes(pod) or self._evict_if_over():
            return
        restart_policy = (pod.get("spec") or {}).get("restartPolicy", "Always")
        if not self._run_init(pod, restart_policy):
            return
        for run in self.runs:
            self._supervise(pod, run, restart_policy)

    def _run_init(self, pod: JSON, restart_policy: str) -> bool:
        """True once every init container has completed successfully."""
        for run in self.init_runs:
            if run.terminated is not None and run.terminated.get("exitCode") == 0 and not run.running():
                continue
            policy = "OnFailure" if restart_policy == "Always" else restart_policy
            self._supervise(pod, run, policy, probes=False)
            return False
        return True

    def _supervise(self, pod: JSON, run: ContainerRun, restart_policy: str, probes: bool = True) -> None:
        t = now()
        if run.poll():
            self._after_exit(run, restart_policy, t)
        if run.running():
            if probes:
                self._probe(pod, run, t)
            return
        retry = run.waiting_reason in ("CrashLoopBackOff", "CreateContainerConfigError")
        if t >= run.backoff_until and (run.attempts == 0 or retry):
            self._start(pod, run, t, restart_policy)

    def _after_exit(self, run: ContainerRun, restart_policy: str, t: float) -> None:
        term = run.terminated
        oom = self.cgroups.oom_kills(self.uid, run.name) > self.oom_at_start.get(run.name, 0)
        if term is not None and term.get("exitCode") == 137 and oom:
            term["reason"] = "OOMKilled"
            self._event("OOMKilled", f"container {run.name} was killed: over its memory limit", run)
        if will_restart(run, restart_policy):
            ran = t - run.started_mono if run.started_mono else 0.0
            failures = self.backoff_counts.get(run.name, 0)
            delay, self.backoff_counts[run.name] = self.cfg.backoff.next(failures, ran)
            run.backoff_until = t + delay
            run.waiting_reason = "CrashLoopBackOff"
            run.waiting_message = (
                f"back-off {delay:g}s restarting failed container={run.name} pod={self.pod_name}"
            )
        else:
            run.waiting_reason = ""
            run.waiting_message = ""

    def _start(self, pod: JSON, run: ContainerRun, t: float, restart_policy: str) -> None:
        ctx = self._context(pod)
        base = envvars.base_env(self.cfg.host_env, self.cfg.venv_bin)
        base.update(envvars.service_env(self._api_server()))
        try:
            sec = security.effective(pod, run.spec, self._field_path(pod, run))
            if sec.uid != 0:
                base["HOME"] = str(self._home(run, sec))
            env = envvars.resolve_env(ctx, run.spec, base, self._secret, self._configmap)
            sandbox = self._sandbox_spec(pod, run, sec)
        except (envvars.EnvError, security.SecurityError, ValueError, OSError) as exc:
            if run.waiting_reason != "CreateContainerConfigError" or run.waiting_message != str(exc):
                self._event("Failed", f"Error: {exc}", run)
            run.waiting_reason = "CreateContainerConfigError"
            run.waiting_message = str(exc)
            run.backoff_until = t + RETRY_S
            return
        start_error = ""
        try:
            argv = envvars.command_line(run.spec, env)
        except envvars.EnvError as exc:
            argv = []
            start_error = str(exc)
        if run.attempts > 0:
            run.restart_count += 1
        if not argv:
            run.attempts += 1
            if run.terminated is not None:
                run.last_terminated = run.terminated
            run.terminated = {
                "exitCode": 128,
                "reason": "StartError",
                "message": start_error,
                "startedAt": utc_now(),
                "finishedAt": utc_now(),
            }
        else:
            self.oom_at_start[run.name] = self.cgroups.oom_kills(self.uid, run.name)
            prefix = [*cgroups.join_prefix(self._cgroup_procs), *self._exec_prefix(), *sandbox]
            run.start(argv, env, run.spec.get("workingDir"), prefix=prefix)
        if run.terminated is not None:  # the exec itself failed
            run.started_mono = t
            self._after_exit(run, restart_policy, t)
            return
        streaming.write_exec_info(
            self.pod_dir,
            self.net.netns if self.net is not None else "",
            self.pod_ip,
            [r.name for r in self.runs],
            run.name,
            env,
            run.spec.get("workingDir") or str(self.pod_dir),
        )
        run.probes = {
            kind: ProbeState(run.spec[key], started_at=t)
            for kind, key in (
                ("startup", "startupProbe"),
                ("liveness", "livenessProbe"),
                ("readiness", "readinessProbe"),
            )
            if run.spec.get(key)
        }
        run.started = "startup" not in run.probes
        run.ready = run.started and "readiness" not in run.probes

    def _probe(self, pod: JSON, run: ContainerRun, t: float) -> None:
        if run.kill_deadline is not None:
            return
        cwd = run.spec.get("workingDir") or str(self.pod_dir)
        grace = float((pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
        startup = run.probes.get("startup")
        if startup is not None and not run.started:
            if startup.due(t):
                ok, msg = self._run_probe(startup.probe, run, cwd)
                startup.record(ok, msg, now())
                if startup.result is True:
                    run.started = True
                    run.ready = "readiness" not in run.probes
                elif startup.result is False:
                    run.terminate(grace, f"Startup probe failed: {msg}")
            return
        liveness = run.probes.get("liveness")
        if liveness is not None and liveness.due(t):
            ok, msg = self._run_probe(liveness.probe, run, cwd)
            liveness.record(ok, msg, now())
            if liveness.result is False:
                probe_grace = liveness.probe.get("terminationGracePeriodSeconds")
                run.terminate(
                    float(probe_grace) if probe_grace is not None else grace, f"Liveness probe failed: {msg}"
                )
                run.ready = False
                return
        readiness = run.probes.get("readiness")
        if readiness is not None and readiness.due(t):
            ok, msg = self._run_probe(readiness.probe, run, cwd)
            readiness.record(ok, msg, now())
            if readiness.result is not None:
                run.ready = readiness.result

    # --- deletion ---------------------------------------------------------------------
    def _terminate_step(self, pod: JSON) -> bool:
        """Graceful stop, then the final (grace 0) delete. True when the pod is gone."""
        meta = pod.get("metadata") or {}
        if self.terminating_since is None:
            grace = meta.get("deletionGracePeriodSeconds")
            if grace is None:
                grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
            self.terminating_since = now()
            for run in self.init_runs + self.runs:
                run.terminate(float(grace))
                run.waiting_reason = ""
        for run in self.init_runs + self.runs:
            run.poll()
        if any(r.running() for r in self.init_runs + self.runs):
            self._report(pod)
            return False
        self._report(pod)
        try:
            self.api.delete(
                f"/api/v1/namespaces/{self.namespace}/pods/{self.pod_name}",
                {"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}},
            )
        except ApiError as exc:
            if exc.status not in (404, 409):
                raise
        self._cleanup_dir()
        return True

    def _stop_all(self, grace: float) -> None:
        runs = self.init_runs + self.runs
        for run in runs:
            run.terminate(grace)
        deadline = now() + grace + 1
        while any(r.running() for r in runs) and now() < deadline:
            for run in runs:
                run.poll()
            time.sleep(0.1)
        for run in runs:
            run.kill_now()
        # a stopping kubelet leaves no mount nor cgroup behind either; a restarted one redoes them
        self.cgroups.remove_pod(self.uid)
        self.volumes.teardown()
        if self._gone.is_set():
            self._cleanup_dir()

    def _cleanup_dir(self) -> None:
        # keep the logs (`pdwarden cluster logs`), drop the volumes (credentials) and what exec reads
        self.cgroups.remove_pod(self.uid)
        self.volumes.teardown()
        shutil.rmtree(self.pod_dir / "home", ignore_errors=True)
        for spec_file in self.pod_dir.glob("*.sandbox.json"):
            spec_file.unlink(missing_ok=True)
        (self.pod_dir / streaming.EXEC_INFO).unlink(missing_ok=True)

    # --- status -----------------------------------------------------------------------
    def _report(self, pod: JSON) -> None:
        if self.frozen and self.last_status is None:
            self.last_status = pod.get("status") or {}
            return
        if self.frozen:
            return
        previous = dict(pod)
        if self.last_status is not None:
            previous = {**pod, "status": self.last_status}
        if self.sandbox_error:
            for run in self.init_runs + self.runs:
                if not run.running() and run.attempts == 0:
                    run.waiting_reason, run.waiting_message = "CreateContainerConfigError", self.sandbox_error
        elif self.volume_error:
            for run in self.init_runs + self.runs:
                if not run.running() and run.attempts == 0:
                    run.waiting_reason, run.waiting_message = "ContainerCreating", self.volume_error
        status = pod_status(
            previous,
            self.init_runs,
            self.runs,
            self.pod_ip,
            self.cfg.node_ip,
            self.start_time,
            sandbox_ready=bool(self.pod_ip) and not self.sandbox_error,
            initialized=all(
                r.terminated is not None and r.terminated.get("exitCode") == 0 for r in self.init_runs
            ),
            timestamp=utc_now(),
        )
        if self._init_failed(pod):
            status["phase"] = "Failed"
        if self.evicted:
            status.update(phase="Failed", reason="Evicted", message=self.evicted)
        if status == self.last_status:
            return
        self.api.merge_patch(
            f"/api/v1/namespaces/{self.namespace}/pods/{self.pod_name}/status", {"status": status}
        )
        self.last_status = status

    def _init_failed(self, pod: JSON) -> bool:
        policy = (pod.get("spec") or {}).get("restartPolicy", "Always")
        return policy == "Never" and any(
            r.terminated is not None and r.terminated.get("exitCode") != 0 for r in self.init_runs
        )

    # --- admission, volumes, isolation ---------------------------------------------------
    def _admit(self, pod: JSON) -> bool:
        """Refuse, once and loudly, a pod asking for what this kubelet cannot honour."""
        if self.refused is None:
            self.refused = refusal.refusals(pod)
            if self.refused:
                message = "; ".join(str(r) for r in self.refused)
                self.sandbox_error = f"the local kubelet cannot honour {message}"
                self._event("Failed", f"Error: {self.sandbox_error}")
                log.error("%s: %s", self.name, self.sandbox_error)
        return not self.refused

    def _evict_if_over(self) -> bool:
        """A disk emptyDir over its sizeLimit: the pod is evicted as a kubelet's eviction
        manager does (containers stopped, phase Failed, reason Evicted); its controller
        replaces it."""
        over = self.volumes.over_limit()
        if over is None:
            return False
        name, limit = over
        self.evicted = f'Usage of EmptyDir volume "{name}" exceeds the limit "{limit}". '
        self._event("Evicted", self.evicted)
        log.warning("%s: evicted: %s", self.name, self.evicted)
        for run in self.init_runs + self.runs:
            run.terminate(0.0)
        return True

    def _ensure_volumes(self, pod: JSON) -> bool:
        """Volumes set up (and refreshed); False while one cannot be (FailedMount)."""
        self.volumes.ctx = self._context(pod)
        if self.volume_error and now() < self.volume_retry_at:
            return False
        try:
            self.volumes.prepare()
            self.volumes.refresh()
        except (volumes.VolumeError, ApiError, OSError, ValueError) as exc:
            message = f"MountVolume.SetUp failed: {exc}"
            if message != self.volume_error:
                self._event("FailedMount", message)
            self.volume_error, self.volume_retry_at = message, now() + RETRY_S
            return not any(r.attempts == 0 for r in self.init_runs + self.runs)
        self.volume_error = ""
        return True

    @staticmethod
    def _field_path(pod: JSON, run: ContainerRun) -> str:
        kind = "initContainers" if run.init else "containers"
        names = [c.get("name") for c in (pod.get("spec") or {}).get(kind) or []]
        return f"spec.{kind}[{names.index(run.name)}]"

    def _home(self, run: ContainerRun, sec: security.Security) -> Path:
        """A non-root user's own home (the host's HOME is root's): in the pod's state dir, so
        it is read-only under readOnlyRootFilesystem like the rest of the root."""
        home = self.pod_dir / "home" / run.name
        home.mkdir(parents=True, exist_ok=True)
        os.chown(home, sec.uid, sec.gid)
        home.chmod(0o700)
        return home

    def _sandbox_spec(self, pod: JSON, run: ContainerRun, sec: security.Security) -> list[str]:
        """Write what the sandbox applies for `run`; the argv prefix that applies it."""
        spec = pod.get("spec") or {}
        where = self._field_path(pod, run)
        plan = volumes.mount_plan(run.spec, spec.get("volumes") or [], self.volumes.sources, where)
        self._cgroup_procs = self.cgroups.create(self.uid, run.name, cgroups.Limits.of(run.spec))
        doc = {
            "mounts": [m.to_json() for m in plan],
            "readOnlyRoot": sec.read_only_root,
            "uid": sec.uid,
            "gid": sec.gid,
            "groups": list(sec.groups),
            "caps": [security.CAP_NUMBERS[c] for c in sec.caps],
            "noNewPrivs": sec.no_new_privs,
            "seccompRuntimeDefault": sec.seccomp_default,
            "traversable": list(TRAVERSABLE),
            "image": list(IMAGE_PATHS),
            "createdLog": str(self.cfg.state_dir / CREATED_MOUNT_POINTS),
        }
        run.user = (sec.uid, sec.gid)
        path = self.pod_dir / f"{run.name}.sandbox.json"
        path.write_text(json.dumps(doc) + "\n")
        return [*SANDBOX, str(path), "--"]

    def _context(self, pod: JSON) -> envvars.PodContext:
        return envvars.PodContext(
            pod=pod, pod_ip=self.pod_ip, host_ip=self.cfg.node_ip, node_name=self.node_name
        )

    def _event(self, reason: str, message: str, run: ContainerRun | None = None) -> None:
        """A Warning Event on the pod, as a kubelet records one (best effort, once per message)."""
        key = f"{reason}:{message}"
        if key in self.events_sent:
            return
        self.events_sent.add(key)
        involved: JSON = {
            "kind": "Pod",
            "apiVersion": "v1",
            "namespace": self.namespace,
            "name": self.pod_name,
            "uid": self.uid,
        }
        if run is not None:
            kind = "initContainers" if run.init else "containers"
            involved["fieldPath"] = f"spec.{kind}{{{run.name}}}"
        stamp = utc_now()
        try:
            self.api.post(
                f"/api/v1/namespaces/{self.namespace}/events",
                {
                    "apiVersion": "v1",
                    "kind": "Event",
                    "metadata": {"generateName": f"{self.pod_name}.", "namespace": self.namespace},
                    "involvedObject": involved,
                    "reason": reason,
                    "message": message,
                    "type": "Warning",
                    "source": {"component": "kubelet", "host": self.node_name},
                    "reportingComponent": "kubelet",
                    "reportingInstance": self.node_name,
                    "firstTimestamp": stamp,
                    "lastTimestamp": stamp,
                    "count": 1,
                },
            )
        except ApiError as exc:
            log.warning("%s: cannot record event %s: %s", self.name, reason, exc)

    def _api_server(self) -> str:
        return self.cfg.pod_server if self.net is not None and self.cfg.pod_server else self.cfg.server

    def _secret(self, namespace: str, name: str) -> JSON | None:
        return self.api.get_or_none(f"/api/v1/namespaces/{namespace}/secrets/{name}")

    def _configmap(self, namespace: str, name: str) -> JSON | None:
        return self.api.get_or_none(f"/api/v1/namespaces/{namespace}/configmaps/{name}")


def remove_pod_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _carry_restart_counts(pod: JSON, runs: list[ContainerRun]) -> None:
    """After a kubelet restart, a container that ran before restarts: its count goes on."""
    previous = {c.get("name"): c for c in (pod.get("status") or {}).get("containerStatuses") or []}
    for run in runs:
        old = previous.get(run.name)
        if old and ("running" in (old.get("state") or {}) or "terminated" in (old.get("state") or {})):
            run.restart_count = int(old.get("restartCount") or 0) + 1
        elif old:
            run.restart_count = int(old.get("restartCount") or 0)
