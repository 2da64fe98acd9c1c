"""Scale-out deployment files, checked without an engine: the compose multi-GPU profile, the HAProxy
policy, and the Kubernetes manifests as ``kubectl kustomize`` renders them, schema-validated strictly."""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from mmencode.app.cli import build_parser
from mmencode.app.config import Settings
from mmencode.app.engine.engine import DRAIN_GRACE_S
from mmencode.app.metrics import Metrics
from tests.helpers import require_binary

ROOT = Path(__file__).resolve().parents[2]
HAPROXY = ROOT / "deploy" / "haproxy"
K8S = ROOT / "deploy" / "kubernetes"
# Oldest Kubernetes release the manifests are validated against (still in support when written).
K8S_VERSION = "1.31.0"


def _compose() -> dict[str, Any]:
    compose: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return compose


def _profile(name: str) -> dict[str, dict[str, Any]]:
    return {key: s for key, s in _compose()["services"].items() if name in s.get("profiles", [])}


def _seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+)s", duration)
    assert match, duration
    return float(match.group(1))


# ----- compose -----
def test_single_and_multi_gpu_profiles_never_start_together() -> None:
    services = _compose()["services"]
    assert all(s.get("profiles") for s in services.values()), "an unprofiled service would start in both"
    published = {name: [p.split(":")[-2] for p in s.get("ports", [])] for name, s in services.items()}
    assert "8000" in published["mmencode"] and "8000" in published["lb"]
    assert set(_profile("single")) == {"mmencode"}


def test_multi_gpu_profile_runs_one_process_per_gpu_on_the_shared_cache() -> None:
    services = _profile("multi-gpu")
    replicas = {name: s for name, s in services.items() if name.startswith("mmencode-gpu")}
    assert len(replicas) >= 2
    devices = []
    for name, service in replicas.items():
        args = build_parser().parse_args(service["command"][1:])  # parses with the real CLI
        assert args.host == "0.0.0.0" and args.port == "8000"
        env = service["environment"]
        settings = Settings(model=env["MMENCODE_MODEL"], shared_cache=env["MMENCODE_SHARED_CACHE"])
        assert settings.shared_cache is not None
        assert settings.shared_cache.split("//")[1].split(":")[0] in services, "the cache service is in the profile"
        assert "ports" not in service, f"{name} is reached through the balancer only"
        reservation = service["deploy"]["resources"]["reservations"]["devices"][0]
        devices += reservation["device_ids"]
        assert "/ready" in " ".join(service["healthcheck"]["test"])
        assert _seconds(service["stop_grace_period"]) > DRAIN_GRACE_S
    assert len(devices) == len(set(devices)) == len(replicas), "each replica has its own GPU"

    balancer = services["lb"]
    mounted = {volume.split(":")[1] for volume in balancer["volumes"]}
    # Every file the command names is mounted, and so is the folder of JSON error pages the policy names.
    assert "/usr/local/etc/haproxy/errors" in mounted
    assert [arg for arg in balancer["command"] if arg.startswith("/")] == sorted(
        mounted - {"/usr/local/etc/haproxy/errors"}
    )
    servers = re.findall(r"^\s*server\s+\S+\s+(\S+):8000", (HAPROXY / "replicas.cfg").read_text(), re.M)
    assert sorted(servers) == sorted(replicas), "replicas.cfg names exactly the profile's replicas"


# ----- HAProxy -----
def _directives(path: Path) -> list[str]:
    return [line.split("#")[0].strip() for line in path.read_text().splitlines() if line.split("#")[0].strip()]


def test_haproxy_policy_balances_by_least_connections_and_checks_readiness() -> None:
    policy = _directives(HAPROXY / "haproxy.cfg")
    assert "balance leastconn" in policy
    assert "http-check send meth GET uri /ready" in policy and "http-check expect status 200" in policy
    assert any(d.startswith("retry-on") and "conn-failure" in d and "empty-response" in d for d in policy)
    assert "option http-buffer-request" in policy and "option redispatch 1" in policy
    timeout_server = next(d for d in policy if d.startswith("timeout server"))
    assert _seconds(timeout_server.split()[-1]) > Settings().request_timeout  # mmencode answers 504 first


def test_haproxy_accepts_the_shipped_files() -> None:
    binary = require_binary("haproxy", "haproxy")
    result = subprocess.run(
        [binary, "-c", "-f", str(HAPROXY / "haproxy.cfg"), "-f", str(HAPROXY / "replicas.cfg")],
        capture_output=True,
        text=True,
    )
    # The compose service names do not resolve here; init-addr none makes that a warning, not an error.
    assert result.returncode == 0, result.stdout + result.stderr


# ----- Kubernetes -----
def _render(directory: Path) -> list[dict[str, Any]]:
    kubectl = require_binary("kubectl", "kubernetes-client")
    rendered = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, check=True)
    return [doc for doc in yaml.safe_load_all(rendered.stdout) if doc]


def _by_kind(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(doc["kind"], doc["metadata"]["name"]): doc for doc in docs}


@pytest.mark.parametrize("variant", [K8S, K8S / "hpa"], ids=["keda", "hpa"])
def test_manifests_render_and_pass_strict_schema_validation(variant: Path) -> None:
    docs = _render(variant)
    built_in = [doc for doc in docs if doc["apiVersion"].split("/")[0] not in {"keda.sh"}]
    for doc in built_in:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    kinds = {kind for kind, _ in _by_kind(docs)}
    assert {"Deployment", "Service", "PodDisruptionBudget", "PersistentVolumeClaim"} <= kinds
    assert ("ScaledObject" in kinds) != ("HorizontalPodAutoscaler" in kinds)


def test_strict_validation_rejects_a_misspelt_field() -> None:
    deployment = _by_kind(_render(K8S))["Deployment", "mmencode"]
    broken = copy.deepcopy(deployment)
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["periodSecond"] = 5
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_deployment_one_gpu_per_pod_probes_and_drain() -> None:
    docs = _by_kind(_render(K8S))
    pod = docs["Deployment", "mmencode"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    build_parser().parse_args(container["args"][1:])
    port = container["ports"][0]
    assert (port["name"], port["containerPort"]) == ("http", 8000)
    # Probes as the README recommends: readiness and startup on /ready, liveness on /health.
    assert container["startupProbe"]["httpGet"]["path"] == "/ready"
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    # SIGTERM comes after preStop; the drain must finish inside the grace period.
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    assert pod["terminationGracePeriodSeconds"] >= int(pre_stop[1]) + DRAIN_GRACE_S
    # The model comes from a read-only volume; the cache directory is writable.
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    env = {e["name"]: e["value"] for e in container["env"]}
    assert mounts[env["MMENCODE_MODEL"]]["readOnly"] is True
    assert env["MMENCODE_CACHE_DIR"] in mounts
    # Kubernetes would set MMENCODE_PORT=tcp://IP:8000 for the Service "mmencode": an invalid port setting.
    assert pod["enableServiceLinks"] is False
    with pytest.raises(ValueError):
        Settings(port="tcp://10.0.0.1:8000")  # type: ignore[arg-type]


def test_shared_cache_is_wired_to_the_valkey_service() -> None:
    docs = _by_kind(_render(K8S))
    container = docs["Deployment", "mmencode"]["spec"]["template"]["spec"]["containers"][0]
    url = next(e["value"] for e in container["env"] if e["name"] == "MMENCODE_SHARED_CACHE")
    assert Settings(shared_cache=url).shared_cache == url
    host, port = url.split("//")[1].split("/")[0].split(":")
    service = docs["Service", host]
    assert service["spec"]["ports"][0]["port"] == int(port)
    backend = docs["Deployment", host]["spec"]["template"]
    assert service["spec"]["selector"].items() <= backend["metadata"]["labels"].items()
    args = backend["spec"]["containers"][0]["args"]
    assert args[args.index("--maxmemory-policy") + 1] == "allkeys-lru"


def test_pdb_and_service_select_the_pods() -> None:
    docs = _by_kind(_render(K8S))
    labels = docs["Deployment", "mmencode"]["spec"]["template"]["metadata"]["labels"]
    for kind in ("Service", "PodDisruptionBudget"):
        spec = docs[kind, "mmencode"]["spec"]
        selector = spec["selector"] if kind == "Service" else spec["selector"]["matchLabels"]
        assert selector.items() <= labels.items()


def test_autoscalers_read_the_queue_depth_the_service_exports() -> None:
    exported = Metrics().render().decode()
    keda = _by_kind(_render(K8S))["ScaledObject", "mmencode"]["spec"]
    assert keda["scaleTargetRef"]["name"] == "mmencode"
    trigger = keda["triggers"][0]
    assert trigger["type"] == "prometheus" and trigger["metadata"]["query"] == "sum(mmencode_queue_depth)"
    hpa = _by_kind(_render(K8S / "hpa"))["HorizontalPodAutoscaler", "mmencode"]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "mmencode"}
    metric = hpa["metrics"][0]["pods"]["metric"]["name"]
    assert metric == "mmencode_queue_depth"
    assert f"# TYPE {metric} gauge" in exported
