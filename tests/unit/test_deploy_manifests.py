"""deploy/kubernetes/: every manifest validates against the Kubernetes 1.37 schemas, offline.

``kubernetes-validate`` (dev extras) ships the JSON schemas; ``strict`` schemas reject a field the
API does not define (a typo such as ``readinessProbe.httpGet.paht``), so an invalid manifest fails
here, in ``scripts/test``, before a cluster sees it. On top of the schema: the ConfigMap's
mcpsync.toml loads with mcpsync's own config loader, every token it names comes from the
ingress's Secret, and the probes point at the endpoints the metrics port serves.
"""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from mcpsync.worker.main.config import load_config

K8S_VERSION = "1.37.0"
MANIFESTS = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"


def _docs() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                out.append((f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return out


DOCS = _docs()


def _by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for _, d in DOCS if d["kind"] == kind}


def test_the_manifests_are_all_there() -> None:
    kinds = sorted((d["kind"], d["metadata"]["name"]) for _, d in DOCS)
    assert kinds == [("ConfigMap", "mcpsync-config"), ("Deployment", "mcpsync-ingress"),
                     ("Deployment", "mcpsync-main"), ("Namespace", "mcpsync"),
                     ("PodDisruptionBudget", "mcpsync-ingress"), ("PodDisruptionBudget", "mcpsync-main"),
                     ("Secret", "mcpsync-credentials"), ("Secret", "mcpsync-upstream-tokens")]


@pytest.mark.parametrize("doc", [d for _, d in DOCS], ids=[name for name, _ in DOCS])
def test_manifest_is_valid_against_the_kubernetes_schema(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("mutate", [
    lambda d: d["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"].update(
        paht="/readyz"),
    lambda d: d["spec"]["template"]["spec"]["containers"][0]["resources"].update(request={"cpu": "1"}),
    lambda d: d["spec"].update(replicas="two"),
    lambda d: d["spec"]["template"]["spec"]["containers"][0].pop("name"),
], ids=["unknown-field", "misspelt-resources", "wrong-type", "missing-required"])
def test_an_invalid_manifest_fails_the_check(mutate: Any) -> None:
    bad = copy.deepcopy(_by_kind("Deployment")["mcpsync-main"])
    mutate(bad)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_the_configmap_is_a_valid_mcpsync_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = _by_kind("ConfigMap")["mcpsync-config"]["data"]["mcpsync.toml"]
    (tmp_path / "mcpsync.toml").write_text(text)
    secrets = _by_kind("Secret")
    for name, value in secrets["mcpsync-credentials"]["stringData"].items():
        monkeypatch.setenv(name, value)
    config = load_config(tmp_path / "mcpsync.toml")
    assert config.database.url is not None and config.database.url.startswith("postgresql://")
    assert config.metrics is not None and config.metrics.host == "0.0.0.0"
    # Every token the servers name is in the Secret only the ingress loads.
    tokens = set(secrets["mcpsync-upstream-tokens"]["stringData"])
    wanted = {var for server in config.servers for var in server.token_env.values()}
    assert wanted and wanted <= tokens, wanted - tokens
    # No credential in the ConfigMap.
    assert "CHANGE-ME" not in text and "token = " not in tomllib.loads(text).get("servers", [{}])[0]


@pytest.mark.parametrize("role", ["main", "ingress"])
def test_the_deployments_probe_the_health_endpoints_and_size_the_pods(role: str) -> None:
    deployment = _by_kind("Deployment")[f"mcpsync-{role}"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"][-3:] == ["worker", "--role", role]
    port = tomllib.loads(_by_kind("ConfigMap")["mcpsync-config"]["data"]["mcpsync.toml"])["metrics"]["port"]
    assert container["ports"][0]["containerPort"] == port
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    resources = container["resources"]
    assert set(resources) == {"requests", "limits"} and {"cpu", "memory"} <= set(resources["requests"])
    secrets = [e["secretRef"]["name"] for e in container["envFrom"]]
    assert ("mcpsync-upstream-tokens" in secrets) == (role == "ingress")  # main opens no MCP session
    selector = deployment["spec"]["selector"]["matchLabels"]
    pdb = _by_kind("PodDisruptionBudget")[f"mcpsync-{role}"]
    assert pdb["spec"]["selector"]["matchLabels"] == selector
    assert deployment["spec"]["replicas"] >= 2 and pdb["spec"]["maxUnavailable"] == 1
