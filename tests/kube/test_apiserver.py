"""The stand-in cluster, proven with the real kubectl: what deployer's pod target will rest on.

Each test names a Kubernetes behaviour deployer depends on; the stand-in must show it to kubectl exactly as a
cluster would, or a test built on it could pass a hot-fix a real cluster silently drops.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import struct
import subprocess
import urllib.parse
from pathlib import Path
from typing import Any

from fixtures_kube import Container, Kube, Probe, Volume
from kube import websocket
from polling import wait_for
from ports import free_port

from deployer.agent.client import AgentClient, bootstrap_argv
from deployer.transport.pipes import local_pipe

PYTHON = "python3"
# A main process that ends on SIGTERM, as a server does (a bare `sleep` as PID 1 ignores it: the grace period runs out).
STOPS_ON_TERM = ("sh", "-c", "trap 'exit 0' TERM; sleep infinity & wait")


def pod_json(kube: Kube, name: str) -> dict[str, Any]:
    return kube.kubectl_json("get", "pod", name)


def status_of(kube: Kube, name: str, container: str) -> dict[str, Any]:
    statuses = pod_json(kube, name)["status"]["containerStatuses"]
    return next(status for status in statuses if status["name"] == container)


def exec_sh(kube: Kube, pod: str, container: str, script: str) -> str:
    done = kube.kubectl("exec", pod, "-c", container, "--", "sh", "-c", script)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


def test_kubectl_lists_pods_by_role_label_with_owner_and_container_status(kube: Kube) -> None:
    owner = kube.owner("LeaderWorkerSet", "pd")
    kube.pod("pd-prefill-0", Container("sglang"), labels={"role": "prefill"}, owner="LeaderWorkerSet/pd")
    kube.pod("pd-decode-0", Container("sglang"), labels={"role": "decode"}, owner="LeaderWorkerSet/pd")

    listed = kube.kubectl_json("get", "pods", "-l", "role=prefill")
    assert [item["metadata"]["name"] for item in listed["items"]] == ["pd-prefill-0"]
    pod = listed["items"][0]
    assert pod["metadata"]["ownerReferences"][0] | {"kind": "LeaderWorkerSet", "uid": owner.uid} == \
        pod["metadata"]["ownerReferences"][0]
    status = pod["status"]["containerStatuses"][0]
    assert (status["ready"], status["restartCount"], status["containerID"][:9]) == (True, 0, "podman://")
    assert "startedAt" in status["state"]["running"]
    both = kube.kubectl_json("get", "pods", "-l", "role in (prefill,decode),role!=router")
    assert sorted(item["metadata"]["name"] for item in both["items"]) == ["pd-decode-0", "pd-prefill-0"]


def test_exec_streams_stdin_through_and_kubectl_exits_with_the_commands_code(kube: Kube) -> None:
    kube.pod("web-0", Container("server"))
    done = kube.kubectl("exec", "-i", "web-0", "-c", "server", "--", "sh", "-c", "cat; echo to-stderr >&2; exit 3",
                        stdin=b"through the pipe\n")
    assert done.returncode == 3, done.stderr.decode()
    assert done.stdout == b"through the pipe\n"
    assert b"to-stderr" in done.stderr
    assert kube.kubectl("exec", "web-0", "-c", "server", "--", "true").returncode == 0
    on_path = subprocess.run(["kubectl", "version", "--client", "-o", "json"], env=kube.env, capture_output=True,
                             check=True)
    assert json.loads(on_path.stdout)["clientVersion"]["minor"] == "37"  # kube.env finds the pinned kubectl


def test_exec_carries_a_megabyte_each_way(kube: Kube) -> None:
    kube.pod("web-0", Container("server"))
    payload = os.urandom(1 << 20)
    program = ("import sys,hashlib;d=sys.stdin.buffer.read();sys.stdout.buffer.write(d[::-1]);"
               "sys.stderr.write(hashlib.sha256(d).hexdigest())")
    done = kube.kubectl("exec", "-i", "web-0", "-c", "server", "--", PYTHON, "-c", program, stdin=payload)
    assert done.returncode == 0, done.stderr.decode()[-500:]
    assert done.stdout == payload[::-1]
    assert hashlib.sha256(payload).hexdigest() in done.stderr.decode()


def test_a_long_program_argv_runs_in_the_containers_own_pid_namespace_as_deployers_agent_would(kube: Kube) -> None:
    """`kubectl exec -i POD -c C -- python -I -S -c PROGRAM`: one pipe, stdin closed at its end (v5's close)."""
    kube.pod("web-0", Container("server", ("sleep", "infinity")))
    padding = "#" + "x" * 60_000 + "\n"  # a long -c argument travels in the exec URL
    program = padding + ("import sys,os\ndata=sys.stdin.buffer.read()\n"
                         "main=open('/proc/1/cmdline','rb').read().split(b'\\0')[:2]\n"
                         "print(len(data), main, sys.flags.isolated, sys.flags.no_site)")
    done = kube.kubectl("exec", "-i", "web-0", "-c", "server", "--", PYTHON, "-I", "-S", "-c", program,
                        stdin=b"x" * 1000)
    assert done.returncode == 0, done.stderr.decode()[-500:]
    # 1000 bytes then EOF (the program ended), and PID 1 is the container's command: a real PID namespace.
    assert done.stdout.decode().split() == ["1000", "[b'sleep',", "b'infinity']", "1", "1"]


def test_a_deleted_pod_comes_back_from_its_controller_with_a_new_uid(kube: Kube) -> None:
    kube.owner("StatefulSet", "sglang")
    kube.owner("ReplicaSet", "router-5d4f")
    volumes = (Volume("scratch"), Volume("models", "persistentVolumeClaim", "models-claim"))
    mounts = {"scratch": "/scratch", "models": "/models"}
    kube.pod("sglang-0", Container("server", STOPS_ON_TERM, mounts=mounts), volumes=volumes,
             owner="StatefulSet/sglang")
    kube.pod("router-5d4f-abcde", Container("router", STOPS_ON_TERM), owner="ReplicaSet/router-5d4f")
    first = pod_json(kube, "sglang-0")["metadata"]["uid"]
    exec_sh(kube, "sglang-0", "server", "echo kept > /models/fix; echo lost > /scratch/fix")

    deleted = kube.kubectl("delete", "pod", "sglang-0", "router-5d4f-abcde")
    assert deleted.returncode == 0, deleted.stderr.decode()

    again = kube.wait_running("sglang-0")  # a StatefulSet's pod keeps its name, after the old one is gone
    assert again.uid != first and pod_json(kube, "sglang-0")["metadata"]["uid"] == again.uid
    # a PVC outlives the pod, an emptyDir does not
    assert exec_sh(kube, "sglang-0", "server", "cat /models/fix; ls /scratch") == "kept\n"
    names = [item["metadata"]["name"] for item in kube.kubectl_json("get", "pods")["items"]]
    router = [name for name in names if name.startswith("router-5d4f-")]
    assert router and "router-5d4f-abcde" not in router  # a ReplicaSet's replacement gets a new generated name


def test_a_container_restart_is_a_new_container_from_the_image(kube: Kube, tmp_path: Path) -> None:
    """Files written into the layer (and over the image's own files) are gone; a volume's are kept."""
    image_checkout = tmp_path / "image-checkout"
    image_checkout.mkdir()
    (image_checkout / "server.py").write_text("shipped in the image\n")
    server = Container("server", mounts={"cache": "/cache"}, image_files={"/sgl-workspace": image_checkout})
    kube.pod("sglang-0", server, volumes=(Volume("cache"),))
    before = status_of(kube, "sglang-0", "server")
    uid = pod_json(kube, "sglang-0")["metadata"]["uid"]
    exec_sh(kube, "sglang-0", "server", "echo hot-fix > /sgl-workspace/server.py; echo layer > /etc/standin-fix; "
            "echo volume > /cache/fix")
    assert exec_sh(kube, "sglang-0", "server", "cat /sgl-workspace/server.py") == "hot-fix\n"
    assert (image_checkout / "server.py").read_text() == "shipped in the image\n"  # the image never changes

    kube.kill_main("sglang-0", "server")
    kube.wait_pod(lambda pod: pod.containers["server"].restart_count == 1 and pod.containers["server"].running,
                  "the kubelet's new container")

    after = status_of(kube, "sglang-0", "server")
    assert after["restartCount"] == 1 and after["containerID"] != before["containerID"]
    assert after["lastState"]["terminated"]["exitCode"] == 137
    assert pod_json(kube, "sglang-0")["metadata"]["uid"] == uid  # the same pod
    shown = kube.kubectl("get", "pod", "sglang-0").stdout.decode().splitlines()  # what an operator sees
    assert shown[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert shown[1].split()[:4] == ["sglang-0", "1/1", "Running", "1"]
    assert exec_sh(kube, "sglang-0", "server", "cat /sgl-workspace/server.py; cat /cache/fix; "
                   "cat /etc/standin-fix 2>/dev/null || echo no-layer-file") == \
        "shipped in the image\nvolume\nno-layer-file\n"


def test_ready_follows_the_readiness_probe_through_a_restart(kube: Kube) -> None:
    """Running is not Ready: deployer's proof of a restart waits for Ready, which the probe decides."""
    port = free_port()
    server = Container("server", (PYTHON, "-m", "http.server", str(port), "--bind", "127.0.0.1"),
                       readiness=Probe(port))
    kube.pod("web-0", server)
    kube.pod("idle-0", Container("server", readiness=Probe(free_port())))  # runs, never serves
    idle = status_of(kube, "idle-0", "server")
    assert (idle["ready"], "running" in idle["state"]) == (False, True)
    wait_for(lambda: status_of(kube, "web-0", "server")["ready"], "ready once it serves")
    kube.kill_main("web-0", "server")
    kube.wait_pod(lambda pod: pod.containers["server"].restart_count == 1, "the new container")
    wait_for(lambda: status_of(kube, "web-0", "server")["ready"], "ready again once the new container serves")
    conditions = {item["type"]: item["status"] for item in pod_json(kube, "web-0")["status"]["conditions"]}
    assert conditions["Ready"] == "True"


def test_exec_into_a_container_that_is_not_running_fails_as_the_kubelet_says(kube: Kube) -> None:
    kube.pod("crash-0", Container("server", ("sh", "-c", "exit 1")), running=False)
    kube.wait_pod(lambda pod: pod.containers["server"].waiting == "CrashLoopBackOff", "a crash loop")
    done = kube.kubectl("exec", "crash-0", "-c", "server", "--", "true")
    assert done.returncode == 1
    assert 'unable to upgrade connection: container not found ("server")' in done.stderr.decode()


def test_a_pod_whose_main_process_exits_by_itself_is_restarted_too(kube: Kube) -> None:
    kube.pod("job-0", Container("worker", ("sh", "-c", "sleep 0.3; exit 7")))
    kube.wait_pod(lambda pod: pod.containers["worker"].restart_count >= 1, "a restart after exit 7")
    status = status_of(kube, "job-0", "worker")
    assert status["lastState"]["terminated"]["exitCode"] == 7


def test_a_leaderworkerset_recreates_the_whole_group_when_one_container_restarts(kube: Kube) -> None:
    """RecreateGroupOnPodRestart (LeaderWorkerSet's default): no container restart in place, a new group instead."""
    kube.owner("LeaderWorkerSet", "pd", recreate_group=True)
    group = {"leaderworkerset.sigs.k8s.io/group-index": "0"}
    leader = kube.pod("pd-0", Container("sglang", STOPS_ON_TERM), labels=group, owner="LeaderWorkerSet/pd")
    worker = kube.pod("pd-0-1", Container("sglang", STOPS_ON_TERM), labels=group, owner="LeaderWorkerSet/pd")
    other = kube.pod("pd-1", Container("sglang", STOPS_ON_TERM),
                     labels={"leaderworkerset.sigs.k8s.io/group-index": "1"}, owner="LeaderWorkerSet/pd")

    kube.kill_main("pd-0-1", "sglang")

    for name, old in (("pd-0", leader), ("pd-0-1", worker)):
        kube.wait_pod(lambda pod, name=name, old=old: pod.name == name and pod.uid != old.uid  # type: ignore[misc]
                      and pod.containers["sglang"].running, f"{name} recreated")
    assert kube.live("pd-1") is other and other.containers["sglang"].restart_count == 0


def test_forbidden_and_not_found_read_as_kubectl_prints_them(kube: Kube) -> None:
    kube.pod("web-0", Container("server"))
    kube.forbid("create", "pods/exec")
    denied = kube.kubectl("exec", "web-0", "-c", "server", "--", "true")
    assert denied.returncode == 1
    assert ('pods "web-0" is forbidden: User "deployer-test" cannot create resource "pods/exec" in API group "" '
            'in the namespace "serving"') in denied.stderr.decode()

    kube.forbid("list", "pods")
    listing = kube.kubectl("get", "pods")
    assert listing.returncode == 1
    assert ('Error from server (Forbidden): pods is forbidden: User "deployer-test" cannot list resource "pods" '
            'in API group "" in the namespace "serving"') in listing.stderr.decode()

    missing = kube.kubectl("exec", "-i", "nope-0", "-c", "server", "--", "true")
    assert missing.returncode == 1
    assert 'Error from server (NotFound): pods "nope-0" not found' in missing.stderr.decode()
    other = kube.kubectl("get", "pod", "web-0", "-n", "elsewhere")
    assert 'Error from server (NotFound): namespaces "elsewhere" not found' in other.stderr.decode()
    wrong = kube.kubectl("exec", "web-0", "-c", "sidecar", "--", "true")
    assert wrong.returncode == 1 and "container sidecar is not valid for pod web-0" in wrong.stderr.decode()


def test_an_annotation_kubectl_sets_is_shown_and_a_new_pod_does_not_carry_it(kube: Kube) -> None:
    kube.owner("StatefulSet", "sglang")
    kube.pod("sglang-0", Container("server", STOPS_ON_TERM), annotations={"team": "serving"},
             owner="StatefulSet/sglang")
    done = kube.kubectl("annotate", "pod", "sglang-0", "deployer.dev/run=20261203-abc")
    assert done.returncode == 0, done.stderr.decode()
    assert pod_json(kube, "sglang-0")["metadata"]["annotations"] == {"team": "serving",
                                                                     "deployer.dev/run": "20261203-abc"}
    old = kube.live("sglang-0")
    assert kube.kubectl("delete", "pod", "sglang-0").returncode == 0
    kube.wait_pod(lambda pod: pod.name == "sglang-0" and pod is not old and pod.deletion is None, "the new pod")
    assert pod_json(kube, "sglang-0")["metadata"]["annotations"] == {"team": "serving"}


def test_an_owners_rollout_in_progress_shows_in_its_status(kube: Kube) -> None:
    owner = kube.owner("StatefulSet", "sglang", replicas=2)
    settled = kube.kubectl_json("get", "statefulset", "sglang")
    assert (settled["status"]["updatedReplicas"], settled["status"]["readyReplicas"]) == (2, 2)
    with kube.cluster.lock:
        owner.updated_replicas, owner.ready_replicas = 1, 1
    rolling = kube.kubectl_json("get", "statefulsets.apps", "sglang")
    assert (rolling["spec"]["replicas"], rolling["status"]["updatedReplicas"]) == (2, 1)


def test_a_client_that_offers_only_v4_gets_v4_and_the_exit_status_on_channel_3(kube: Kube) -> None:
    """kubectl offers v5 first; an older client (v4: no close of stdin) still gets frames and the Status."""
    kube.pod("web-0", Container("server"))
    query = urllib.parse.urlencode([("command", "sh"), ("command", "-c"),
                                    ("command", "echo out; echo err >&2; exit 5"), ("container", "server"),
                                    ("stdout", "true"), ("stderr", "true")])
    protocol, frames = raw_exec(kube.url, f"/api/v1/namespaces/serving/pods/web-0/exec?{query}",
                                "v4.channel.k8s.io, channel.k8s.io")
    assert protocol == "v4.channel.k8s.io"
    by_channel: dict[int, bytes] = {}
    for channel, data in frames:
        by_channel[channel] = by_channel.get(channel, b"") + data
    assert (by_channel[websocket.STDOUT], by_channel[websocket.STDERR]) == (b"out\n", b"err\n")
    status = json.loads(by_channel[websocket.STATUS])
    assert (status["reason"], status["details"]["causes"]) == ("NonZeroExitCode",
                                                               [{"reason": "ExitCode", "message": "5"}])


def raw_exec(url: str, path: str, protocols: str) -> tuple[str, list[tuple[int, bytes]]]:
    """A minimal WebSocket client: the handshake, then every data frame until the server's close."""
    host, port = urllib.parse.urlsplit(url).netloc.split(":")
    key = base64.b64encode(os.urandom(16)).decode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall((f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                      f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                      f"Sec-WebSocket-Protocol: {protocols}\r\n\r\n").encode())
        stream = sock.makefile("rb")
        head = [stream.readline()]
        while head[-1] not in (b"\r\n", b""):
            head.append(stream.readline())
        assert head[0].startswith(b"HTTP/1.1 101"), head
        fields = dict(line.decode().strip().split(": ", 1) for line in head[1:-1])
        assert fields["Sec-WebSocket-Accept"] == websocket.accept_key(key)
        frames: list[tuple[int, bytes]] = []
        while True:
            first, second = stream.read(2)
            size = second & 0x7F
            if size == 126:
                (size,) = struct.unpack("!H", stream.read(2))
            elif size == 127:
                (size,) = struct.unpack("!Q", stream.read(8))
            payload = stream.read(size)
            if first & 0x0F == websocket.OP_CLOSE:
                return fields["Sec-WebSocket-Protocol"], frames
            frames.append((payload[0], payload[1:]))


def test_no_container_outlives_the_cluster_not_even_a_replacement_made_after_a_delete(kube: Kube) -> None:
    kube.owner("ReplicaSet", "router-5d4f")
    kube.pod("router-5d4f-abcde", Container("router", STOPS_ON_TERM), owner="ReplicaSet/router-5d4f")
    assert kube.kubectl("delete", "pod", "router-5d4f-abcde").returncode == 0
    kube.wait_pod(lambda pod: pod.name != "router-5d4f-abcde" and pod.containers["router"].running, "a replacement")

    kube.cluster.shutdown()

    left = subprocess.run(["podman", "ps", "-a", "--format", "{{.Names}}", "--filter",
                           f"name={kube.cluster.kubelet.prefix}"], env=kube.cluster.kubelet.env, capture_output=True,
                          text=True, check=True)
    assert left.stdout.split() == []


def test_deployers_own_agent_speaks_its_protocol_through_kubectl_exec(kube: Kube, monkeypatch: Any) -> None:
    """The real agent, started as the pod target will start it, over one kubectl exec pipe: a put lands in
    the pod's container (not on this machine) and a run sees it there."""
    kube.pod("sglang-0", Container("server"))
    for key in ("KUBECONFIG", "KUBECACHEDIR", "PATH"):
        monkeypatch.setenv(key, kube.env[key])
    within = ["kubectl", "exec", "-i", "sglang-0", "-c", "server", "--"]
    agent = AgentClient(local_pipe(bootstrap_argv(PYTHON, within), "sglang-0"), name="sglang-0").start(60)
    try:
        agent.put("/srv/agent-wrote-this", b"in the pod\n")
        ran = agent.run(["sh", "-c", "cat /srv/agent-wrote-this; cat /proc/1/cmdline | tr '\\0' ' '"])
    finally:
        agent.close()
    assert ran.stdout == b"in the pod\nsleep infinity "  # the container's PID 1, not this machine's
    assert not Path("/srv/agent-wrote-this").exists()
