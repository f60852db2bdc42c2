"""`ControlPlane`: start the real control plane as envtest starts one, and stop it.

etcd (no fsync), kube-apiserver (RBAC, certificates made for this plane, the aggregator's front
proxy, Services on loopback addresses: `--service-cluster-ip-range=127.20.0.0/16`, which the
node agent forwards as kube-proxy would), kube-controller-manager with only the controllers the
tests need (garbage collector, namespaces, service accounts, the root CA ConfigMap),
kube-scheduler (it binds pods with the real fit checks), Kueue (`kueue_install`) and the node
agent, which runs the pods bound to its node as local processes. Each part is a process of its
own with its log in `<root>/logs/`; every port is a free one, picked at start, except 0.14's
visibility server (8082, fixed in that release). Everything is stopped and, unless kept,
removed by `stop`.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kernel_queue_fake_cluster.control_plane import build, kueue_install, pki, ports, releases
from kernel_queue_fake_cluster.control_plane.client import AdminClient, ApiError

SERVICE_RANGE = "127.20.0.0/16"
"""Services' cluster IPs: loopback addresses, so the node agent can listen on them."""
SERVICE_IP = "127.20.0.1"
"""The `kubernetes` Service's cluster IP (the range's first)."""
NODE_NAME = "kq-node"
KUEUE_METRICS_CERTS = Path("/etc/kueue/metrics/certs")
"""Read by every Kueue run with its own certificates (0.14 to 0.19 hard-code it), even with
metrics off."""
KUEUE_VISIBILITY_CERTS = Path("/visibility")
"""The visibility server's certificate folder, hard-coded in Kueue."""
IN_CLUSTER = Path("/var/run/secrets/kubernetes.io/serviceaccount")
"""Where a pod finds its service account's token: Kueue 0.14's visibility server reads it
(`releases.KueueRelease.visibility_in_cluster`)."""
KUEUE_ACCOUNT = "kueue-controller-manager"
STOP_SECONDS = 10.0
CONTROLLERS = (
    "garbage-collector-controller",  # Workloads and Secrets owned by pods go with them
    "namespace-controller",
    "serviceaccount-controller",  # each namespace's `default` (pods need one to be admitted)
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "persistentvolume-binder-controller",  # binds the claims the node agent provisions
    # the API server gives claims and volumes a protection finalizer; these take it off once
    # no pod uses them (else a claim, and its namespace, would never go)
    "persistentvolumeclaim-protection-controller",
    "persistentvolume-protection-controller",
    # lifts the not-ready taint the API server puts on a new Node once the agent reports it
    # Ready, and watches its Lease (the agent renews it)
    "node-lifecycle-controller",
)
"""kube-controller-manager's controllers the tests need; nothing that watches nodes' health."""


class PlaneError(RuntimeError):
    """The control plane could not start; the message says which part and why, with the tail
    of its log."""


@dataclass(frozen=True)
class NodeSpec:
    """The node agent's node: its capacity, and what runs each image."""

    gpus: int = 2
    cpu: str = "16"
    memory: str = "64Gi"
    pods: int = 110
    """Pods the Node offers (the kubelet's default maxPods)."""
    image_paths: dict[str, str] = field(default_factory=dict)
    """Image (fnmatch pattern) -> a folder put first on the container's PATH."""
    missing_images: tuple[str, ...] = ()
    """Images (fnmatch patterns) no registry has: pulling them fails (ErrImagePull, then
    ImagePullBackOff)."""


@dataclass
class _Part:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])

    def check(self) -> None:
        if self.process.poll() is not None:
            raise PlaneError(
                f"{self.name} exited with status {self.process.returncode}; the end of its log "
                f"({self.log}):\n{self.tail()}"
            )


class ControlPlane:
    """A real control plane on this machine, with Kueue release `kueue` ("0.14", "0.19"), whose
    Configuration copies the pod labels `label_keys_to_copy` onto Workloads."""

    def __init__(
        self,
        *,
        kueue: str = "0.19",
        root: str | os.PathLike[str] | None = None,
        node: NodeSpec | None = None,
        binaries: build.Binaries | None = None,
        keep: bool = False,
        agent: bool = True,
        say: Callable[[str], None] = lambda line: None,
        label_keys_to_copy: Sequence[str] = (),
    ) -> None:
        self.release = releases.kueue(kueue)
        self.label_keys_to_copy = tuple(label_keys_to_copy)
        found = binaries or build.built()
        if found is None:
            raise PlaneError(
                "the control plane is not built; run `scripts/control-plane build` (or "
                "`python -m kernel_queue_fake_cluster.control_plane build`) first"
            )
        self.binaries = found
        self._own_root = root is None
        self.root = Path(root or tempfile.mkdtemp(prefix="kernel-queue-control-plane-"))
        self.node = node or NodeSpec()
        self.keep, self.say, self.with_agent = keep, say, agent
        self.parts: list[_Part] = []
        self.ports: dict[str, int] = {}
        self.pki: pki.Pki | None = None
        self.client: AdminClient | None = None
        self.started_seconds = 0.0
        self._wrote_in_cluster = False

    # -- what clients need ---------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    @property
    def kubeconfig(self) -> Path:
        """The admin's kubeconfig (client certificate of group system:masters)."""
        return self.root / "kubeconfig"

    @property
    def agent_root(self) -> Path:
        """The node agent's folder (pods, claims)."""
        return self.root / "node"

    @property
    def admin(self) -> AdminClient:
        assert self.client is not None, "the control plane is not started"
        return self.client

    def kubeconfig_for(self, token: str, *, namespace: str = "default", name: str = "") -> Path:
        """A kubeconfig that authenticates with a bearer `token`."""
        assert self.pki is not None
        path = self.root / (name or f"kubeconfig-{abs(hash(token)) % 10**8}")
        config = _kubeconfig(self.url, self.pki.ca.cert, {"token": token}, namespace)
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def service_account_token(self, namespace: str, name: str, *, seconds: int = 86400) -> str:
        """A token of service account `name` (made if missing), from the TokenRequest API."""
        client = self.admin
        account = {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": name, "namespace": namespace},
        }
        with contextlib.suppress(ApiError):
            client.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", account)
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": seconds},
        }
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"
        return str(client.request("POST", path, request)["status"]["token"])

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """kubectl of the plane's own Kubernetes release, as the admin."""
        command = [
            str(self.binaries.binary("kubectl")),
            "--kubeconfig",
            str(self.kubeconfig),
            *args,
        ]
        done = subprocess.run(command, input=input, capture_output=True, text=True, check=False)
        if check and done.returncode != 0:
            raise PlaneError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
        return done

    # -- start and stop ------------------------------------------------------------------------

    def start(self) -> ControlPlane:
        """Start every part and return once the node is Ready and Kueue serves; on failure
        everything started is stopped and `PlaneError` says what failed."""
        started = time.monotonic()
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        self.started_seconds = time.monotonic() - started
        self.say(f"control plane up in {self.started_seconds:.1f} s at {self.url}")
        return self

    def _start(self) -> None:
        for name in ("etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler"):
            self.ports[name] = ports.draw()
        for name in ("kueue-webhook", "kueue-health", "agent"):
            self.ports[name] = ports.draw()
        fixed = self.release.visibility_port
        self.ports["kueue-visibility"] = fixed if fixed is not None else ports.draw()
        if fixed is not None:
            _port_free(fixed, f"Kueue {self.release.name}'s visibility server")
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        self.pki = pki.make(self.root / "pki", service_ip=SERVICE_IP)
        config = _kubeconfig(
            self.url,
            self.pki.ca.cert,
            {
                "client-certificate": str(self.pki.admin.cert),
                "client-key": str(self.pki.admin.key),
            },
            "default",
        )
        self.kubeconfig.write_text(yaml.safe_dump(config))
        self.kubeconfig.chmod(0o600)
        self.client = AdminClient(
            self.url, self.pki.ca.cert, self.pki.admin.cert, self.pki.admin.key
        )
        self._etcd()
        self._apiserver()
        self._controllers()
        self._kueue()
        if self.with_agent:
            self._agent()
        self.admin.wait(
            "the default service account",
            lambda: self.admin.get("v1", "ServiceAccount", "default", "default"),
        )

    def _spawn(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> _Part:
        log = self.root / "logs" / f"{name}.log"
        with log.open("ab") as out:
            process = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
                cwd=self.root,
            )
        part = _Part(name, process, log)
        self.parts.append(part)
        return part

    def _until(self, part: _Part, what: str, check: Callable[[], bool], within: float = 60) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            part.check()
            with contextlib.suppress(OSError, ApiError, http.client.HTTPException, ssl.SSLError):
                if check():
                    return
            time.sleep(0.1)
        raise PlaneError(f"{part.name}: {what} not within {within:g} s; its log:\n{part.tail()}")

    def _etcd(self) -> None:
        client, peer = self.ports["etcd"], self.ports["etcd-peer"]
        self.say("starting etcd")
        part = self._spawn(
            "etcd",
            [
                str(self.binaries.etcd),
                "--name=kq",
                f"--data-dir={self.root / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{client}",
                f"--advertise-client-urls=http://127.0.0.1:{client}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=kq=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )
        self._until(
            part,
            "etcd healthy",
            lambda: b'"true"' in _http_get(f"http://127.0.0.1:{client}/health"),
        )

    def _apiserver(self) -> None:
        assert self.pki is not None
        p = self.pki
        self.say("starting kube-apiserver")
        part = self._spawn(
            "kube-apiserver",
            [
                str(self.binaries.binary("kube-apiserver")),
                f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
                f"--secure-port={self.ports['apiserver']}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                "--endpoint-reconciler-type=none",  # its Endpoints may not name a loopback address
                f"--cert-dir={self.root / 'pki'}",
                f"--tls-cert-file={p.api_server.cert}",
                f"--tls-private-key-file={p.api_server.key}",
                f"--client-ca-file={p.ca.cert}",
                "--authorization-mode=RBAC",
                f"--service-cluster-ip-range={SERVICE_RANGE}",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={p.service_account_public}",
                f"--service-account-signing-key-file={p.service_account_key}",
                "--allow-privileged=true",
                # as kubeadm sets it: the node's InternalIP (127.0.0.1) first, not its name,
                # which no DNS resolves (pods/log, exec and the like go there)
                "--kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname",
                f"--kubelet-client-certificate={p.kubelet_client.cert}",
                f"--kubelet-client-key={p.kubelet_client.key}",
                f"--requestheader-client-ca-file={p.front_proxy_ca.cert}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={p.front_proxy_client.cert}",
                f"--proxy-client-key-file={p.front_proxy_client.key}",
                "--profiling=false",
                "--v=1",
            ],
        )
        self._until(
            part, "/readyz ok", lambda: self.admin.request("GET", "/readyz") == "ok", within=90
        )

    def _controllers(self) -> None:
        assert self.pki is not None
        kubeconfig = str(self.kubeconfig)
        self.say("starting kube-controller-manager and kube-scheduler")
        manager = self._spawn(
            "kube-controller-manager",
            [
                str(self.binaries.binary("kube-controller-manager")),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--controllers=" + ",".join(CONTROLLERS),
                f"--service-account-private-key-file={self.pki.service_account_key}",
                f"--root-ca-file={self.pki.ca.cert}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports['controller-manager']}",
                "--use-service-account-credentials=false",
            ],
        )
        scheduler = self._spawn(
            "kube-scheduler",
            [
                str(self.binaries.binary("kube-scheduler")),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports['scheduler']}",
            ],
        )
        for part, port in ((manager, "controller-manager"), (scheduler, "scheduler")):
            self._until(part, "/healthz ok", functools.partial(_healthy, self.ports[port]))

    def _kueue(self) -> None:
        assert self.pki is not None
        release, admin = self.release, self.admin
        folder = self.binaries.kueue[release.name]
        config_root = folder / "config"
        ca = self.pki.ca_pem()
        webhook_url = f"https://127.0.0.1:{self.ports['kueue-webhook']}"
        self.say(f"installing Kueue {release.version}")
        admin.apply(
            [
                {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": kueue_install.NAMESPACE},
                }
            ]
        )
        crds = kueue_install.crds(config_root, webhook_url, ca)
        admin.apply(crds)
        names = [crd["metadata"]["name"] for crd in crds]
        admin.wait("Kueue's CRDs established", lambda: kueue_install.established(admin, names))
        certs = self.root / "kueue-certs"
        certs.mkdir()
        for source, target in (
            (self.pki.webhook.cert, "tls.crt"),
            (self.pki.webhook.key, "tls.key"),
        ):
            (certs / target).write_bytes(source.read_bytes())
        _shared_certs()
        config = kueue_install.configuration(
            release,
            webhook_port=self.ports["kueue-webhook"],
            cert_dir=certs,
            health_port=self.ports["kueue-health"],
            visibility_port=self.ports["kueue-visibility"],
            label_keys_to_copy=self.label_keys_to_copy,
        )
        config_file = self.root / "kueue-config.yaml"
        config_file.write_text(yaml.safe_dump(config))
        env = dict(os.environ)
        if release.visibility_in_cluster:
            env.update(self._in_cluster_credentials())
        self.say(f"starting Kueue {release.version}")
        part = self._spawn(
            "kueue",
            [
                str(folder / "bin" / "kueue"),
                f"--config={config_file}",
                f"--kubeconfig={self.kubeconfig}",
                "--zap-log-level=info",
            ],
            env=env,
        )
        ready = f"http://127.0.0.1:{self.ports['kueue-health']}/readyz"
        self._until(part, "/readyz ok", lambda: _http_get(ready) == b"ok", within=90)
        admin.apply(kueue_install.webhooks(config_root, webhook_url, ca))
        services = kueue_install.visibility(config_root, self.ports["kueue-visibility"])
        admin.apply(services)
        names = [doc["metadata"]["name"] for doc in services if doc["kind"] == "APIService"]
        self._until(
            part, "the visibility API available", lambda: kueue_install.available(admin, names)
        )

    def _in_cluster_credentials(self) -> dict[str, str]:
        """Kueue's service account, with the grants its release's manifests give the
        visibility server (delegated authentication and authorization), and its token where a
        pod would find it; the environment that says "in a cluster"."""
        assert self.pki is not None
        namespace = kueue_install.NAMESPACE
        token = self.service_account_token(namespace, KUEUE_ACCOUNT)
        subject = [{"kind": "ServiceAccount", "name": KUEUE_ACCOUNT, "namespace": namespace}]
        rbac = "rbac.authorization.k8s.io/v1"
        self.admin.apply(
            [
                {
                    "apiVersion": rbac,
                    "kind": "ClusterRoleBinding",
                    "metadata": {"name": "kueue-visibility-server-auth-delegator"},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": "system:auth-delegator",
                    },
                    "subjects": subject,
                },
                {
                    "apiVersion": rbac,
                    "kind": "RoleBinding",
                    "metadata": {
                        "name": "kueue-visibility-server-auth-reader",
                        "namespace": "kube-system",
                    },
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "Role",
                        "name": "extension-apiserver-authentication-reader",
                    },
                    "subjects": subject,
                },
            ]
        )
        try:
            IN_CLUSTER.mkdir(parents=True, exist_ok=True)
            (IN_CLUSTER / "token").write_text(token)
            (IN_CLUSTER / "ca.crt").write_bytes(self.pki.ca_pem())
        except PermissionError:
            raise PlaneError(
                f"Kueue {self.release.name}'s visibility server reads its credentials from "
                f"{IN_CLUSTER}, which this user cannot write; run as root"
            ) from None
        # No `namespace` file: what reads one there (kernel-queue's own backend does) would
        # take this plane's `kueue-system` for its own; Kueue's config names its namespace.
        self._wrote_in_cluster = True
        return {
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(self.ports["apiserver"]),
        }

    def _agent(self) -> None:
        self.say("starting the node agent")
        node = self.node
        argv = [
            sys.executable,
            "-m",
            "kernel_queue_fake_cluster.node",
            f"--kubeconfig={self.kubeconfig}",
            f"--node-name={NODE_NAME}",
            f"--root={self.agent_root}",
            f"--gpus={node.gpus}",
            f"--cpu={node.cpu}",
            f"--memory={node.memory}",
            f"--pods={node.pods}",
            f"--kubelet-port={self.ports['agent']}",
        ]
        argv += [f"--image-path={pattern}={path}" for pattern, path in node.image_paths.items()]
        argv += [f"--missing-image={pattern}" for pattern in node.missing_images]
        part = self._spawn("node-agent", argv)

        def ready() -> bool:
            found = self.admin.get("v1", "Node", None, NODE_NAME) or {}
            conditions = (found.get("status") or {}).get("conditions") or []
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

        self._until(part, f"node {NODE_NAME} Ready", ready)

    def stop(self) -> None:
        """Stop every part (SIGTERM, SIGKILL after 10 s), last started first; remove the
        plane's folder unless it was given or `keep` is set."""
        for part in reversed(self.parts):
            _stop(part.process)
        self.parts.clear()
        if self._wrote_in_cluster:  # this plane's credentials, of no use once it stopped
            for name in ("token", "ca.crt"):
                (IN_CLUSTER / name).unlink(missing_ok=True)
            self._wrote_in_cluster = False
        if self._own_root and not self.keep:
            import shutil

            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def logs(self) -> dict[str, Path]:
        """Each part's log file."""
        return {path.stem: path for path in sorted((self.root / "logs").glob("*.log"))}


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(STOP_SECONDS)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(STOP_SECONDS)


def _kubeconfig(url: str, ca: Path, user: dict[str, str], namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kq", "cluster": {"server": url, "certificate-authority": str(ca)}}],
        "users": [{"name": "kq-user", "user": user}],
        "contexts": [
            {"name": "kq", "context": {"cluster": "kq", "user": "kq-user", "namespace": namespace}}
        ],
        "current-context": "kq",
    }


def _http_get(url: str, *, insecure: bool = False) -> bytes:
    import urllib.request

    context = None
    if insecure:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    with urllib.request.urlopen(url, timeout=5, context=context) as response:
        return bytes(response.read()).strip()


def _healthy(port: int) -> bool:
    return _http_get(f"https://127.0.0.1:{port}/healthz", insecure=True) == b"ok"


def _port_free(port: int, who: str) -> None:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Go's listeners
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            raise PlaneError(
                f"port {port} is taken: {who} listens there and cannot be told another; stop "
                f"whatever holds it (`ss -ltnp 'sport = :{port}'` names it)"
            ) from None


def _shared_certs() -> None:
    """The two folders Kueue reads whatever its configuration (see the module's constants):
    written once, the same for every plane on this machine (nothing checks these two: metrics
    are off and the aggregator does not verify the visibility server, as the release's own
    APIServices say)."""
    for folder, name in (
        (KUEUE_METRICS_CERTS, "kueue-metrics"),
        (KUEUE_VISIBILITY_CERTS, "kueue-visibility"),
    ):
        try:
            pki.self_signed(folder, name)
        except PermissionError:
            raise PlaneError(
                f"Kueue reads certificates from {folder}, which this user cannot write; run as "
                f"root, or create {folder} writable for this user once"
            ) from None
