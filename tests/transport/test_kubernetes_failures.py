"""When kubectl cannot reach a cluster: the real kubectl against a kubeconfig whose API server is a free port of
127.0.0.1 that nothing listens on (no cluster needed), and beside it the stand-in cluster (tests/fixtures_kube.py).

A command lists only the selectors of the hosts it names, so a selector host whose cluster is down stops no command
on another host; one it needs fails exit 4 saying it was the listing; and kubectl's own lines are quoted as lines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures_kube import Container, Kube
from fixtures_repo import FIXED_A, ORIGINAL_A, Project, init_repo
from ports import free_port

from deployer.config.models import Pod
from deployer.transport.kubernetes import kubectl_failure

POD_REPO = "/sgl-workspace"


def dead_kubeconfig(tmp_path: Path) -> tuple[Path, str]:
    """A kubeconfig (context `far`) whose API server is a port of 127.0.0.1 with nothing listening; its URL."""
    url = f"https://127.0.0.1:{free_port()}"
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "far",
              "clusters": [{"name": "far", "cluster": {"server": url, "insecure-skip-tls-verify": True}}],
              "users": [{"name": "far", "user": {"token": "not-a-token"}}],
              "contexts": [{"name": "far", "context": {"cluster": "far", "user": "far", "namespace": "serving"}}]}
    path = tmp_path / "far.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path, url


def pod_host(kubeconfig: Path, context: str, **pod: str) -> dict[str, Any]:
    return {"transport": "kubernetes", "repo": POD_REPO, "python": "python3",
            "pod": {"container": "server", "namespace": "serving", "context": context,
                    "kubeconfig": str(kubeconfig), **pod}}


def project_of(tmp_path: Path, kubectl_dir: Path, hosts: dict[str, Any], extra_env: dict[str, str]) -> Project:
    project = Project(root=tmp_path, repo=Path(POD_REPO), host=hosts["sglang"], host_name="sglang",
                      extra_env={"PATH": f"{kubectl_dir}:/usr/bin:/bin", **extra_env})
    project.inventory.write_text(yaml.safe_dump({"hosts": hosts}, sort_keys=False))
    project.write("fix/a.py", FIXED_A)
    project.playbook()
    return project


def test_an_unreachable_api_server_is_exit_4_naming_its_url_and_a_listing_says_it_was_a_listing(
        kubectl_binary: Path, tmp_path: Path) -> None:
    kubeconfig, url = dead_kubeconfig(tmp_path)
    hosts = {"sglang": pod_host(kubeconfig, "far", name="sglang-0"),
             "decode": pod_host(kubeconfig, "far", selector="role=decode")}
    project = project_of(tmp_path, kubectl_binary.parent, hosts, {"KUBECACHEDIR": str(tmp_path / "cache")})

    by_name = project.deployer("check", "fix.yaml", "--host", "sglang")
    output = by_name.stdout + by_name.stderr
    assert by_name.returncode == 4, output
    assert "decode" not in output and "role=decode" not in output, "the unrelated selector was never listed"
    assert f"the API server {url} cannot be reached: nothing listens there (connection refused)" in output, output
    assert "pod 'sglang-0' (container 'server', namespace 'serving', context 'far')" in output, output
    assert "\\x0a" not in output, "kubectl's newlines are line breaks, not escapes"
    said = [line.strip() for line in output.splitlines()]
    assert any(line.startswith("The connection to the server 127.0.0.1:") for line in said), output

    listing = project.deployer("check", "fix.yaml", "--host", "decode")
    output = listing.stdout + listing.stderr
    assert listing.returncode == 4, output
    assert "listing the pods of selector 'role=decode'" in output, output
    assert "get pods --selector role=decode" in output and "--context far --namespace serving" in output, output
    assert "kubectl exec" not in output, output
    assert f"the API server {url} cannot be reached" in output, output


def test_a_selector_whose_cluster_is_down_stops_no_command_on_another_host(kube: Kube, tmp_path: Path) -> None:
    image = tmp_path / "image-checkout"
    init_repo(image, {"pkg/__init__.py": "", "pkg/a.py": ORIGINAL_A})
    kube.pod("sglang-0", Container("server", image_files={POD_REPO: image}))
    far, _ = dead_kubeconfig(tmp_path)
    hosts = {"sglang": pod_host(kube.kubeconfig, kube.context, name="sglang-0"),
             "decode": pod_host(far, "far", selector="role=decode")}
    project = project_of(tmp_path, kube.kubectl_path.parent, hosts, {"KUBECACHEDIR": kube.env["KUBECACHEDIR"]})

    checked = project.deployer("check", "fix.yaml", "--host", "sglang")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "the agent runs in it" in checked.stdout and "decode" not in checked.stdout + checked.stderr
    for args in (("apply", "fix.yaml", "--host", "sglang"), ("plan", "--rollback", "last"), ("rollback", "last")):
        done = project.deployer(*args)
        assert done.returncode == 0, (args, done.stdout + done.stderr)
        assert "role=decode" not in done.stdout + done.stderr, args
    read = kube.kubectl("exec", "sglang-0", "-c", "server", "--", "cat", f"{POD_REPO}/pkg/a.py")
    assert read.stdout.decode() == ORIGINAL_A, "applied, then rolled back"


# kubectl's own words (v1.37) for each way an API server is not reached or refuses us.
SAID = {
    "unauthorized": ("error: You must be logged in to the server (Unauthorized)", "refuses our credentials"),
    "x509": ('Unable to connect to the server: tls: failed to verify certificate: x509: certificate signed by '
             'unknown authority', "its certificate is not trusted (x509)"),
    "no such host": ('E1203 14:52:16.585278   30786 memcache.go:381] "Couldn\'t get current server API group list" '
                     'err="Get \\"https://nohost.invalid:6443/api?timeout=32s\\": dial tcp: lookup nohost.invalid on '
                     '10.255.255.53:53: no such host"\nUnable to connect to the server: dial tcp: lookup nohost.invalid'
                     ' on 10.255.255.53:53: no such host', "https://nohost.invalid:6443 cannot be reached: its host "
                                                           "name does not resolve"),
    "timeout": ("Unable to connect to the server: dial tcp 10.0.0.1:6443: i/o timeout", "it does not answer"),
}


@pytest.mark.parametrize("failure", list(SAID))
def test_each_way_the_api_server_is_not_reached_is_said_as_such(failure: str) -> None:
    stderr, meaning = SAID[failure]
    said = kubectl_failure(Pod(name="sglang-0", container="server", namespace="serving", context="far"), stderr)
    assert said.startswith("kubectl exec ended before the agent started: the API server "), said
    assert meaning in said, said
    assert said.splitlines()[1:] == [f"  {line}" for line in stderr.splitlines()], said


def test_a_selection_lists_the_selectors_it_may_take_and_their_units_partners_only() -> None:
    from deployer.config.podunits import selectors_named
    from deployer.config.units import Unit

    selecting = {"prefill", "decode", "other", "far"}
    units = {"pd": Unit(services=["prefill:server", "decode:server"], group_label="group")}
    groups = {"serving": ["pd", "sglang"], "east": ["other"]}

    def named(*specs: str) -> set[str]:
        return selectors_named(groups, units, selecting, specs)

    assert named("sglang") == set()
    assert named("decode") == {"prefill", "decode"}  # a unit restarts whole: its other selector is listed too
    assert named("serving") == {"prefill", "decode"}
    assert named("pd.0") == {"prefill", "decode"}  # a group_label's unit
    assert named("other.other-0,sglang") == {"other"}  # a selector's pod
    assert named("sglang", "east") == {"other"}  # --limit's names count too
    assert named("gpu-*") == selecting  # which pods a glob matches is known once they are listed
