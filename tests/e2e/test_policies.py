"""The chart's admission policies on a real API server: the ValidatingAdmissionPolicies that
`policies.enabled` renders (templated by a real helm) refuse a ModelDeployment at `kubectl
apply` with their own message; objects from before the policy can still be changed where the
change leaves the checked fields as they were; the tenant namespace gets its GPU quota."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Final

import pytest
import yaml

from inferfleet.devcluster.processes import wait_until
from tests.e2e.conftest import Kubectl
from tests.e2e.test_operator import _sim_deployment
from tests.unit.test_chart import template

PLATFORM: Final = "inferfleet-policies"
REGISTRY: Final = "registry.example.com/ml"
POLICY_KINDS: Final = frozenset(
    {
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ConfigMap",
        "ResourceQuota",
        "LimitRange",
        "PriorityClass",
    }
)


def _model_deployment(name: str, **engine: Any) -> dict[str, Any]:
    deployment = _sim_deployment(name)
    deployment["spec"]["engine"] |= engine
    return deployment


def _apply(kubectl: Kubectl, namespace: str, obj: dict[str, Any], *, dry_run: bool = False) -> str:
    """Apply; the API server's refusal (stderr) or an empty string."""
    args = ["apply", "--server-side", "-n", namespace, "-f", "-"]
    result = kubectl.run(
        *args, *(["--dry-run=server"] if dry_run else []), stdin=yaml.safe_dump(obj), check=False
    )
    return "" if result.returncode == 0 else result.stderr


@pytest.fixture
def policies(kubectl: Kubectl, namespace: str) -> Iterator[list[dict[str, Any]]]:
    kubectl.run("create", "namespace", PLATFORM, check=False)
    objects = [
        o
        for o in template(
            {
                "policies.enabled": "true",
                "policies.allowedImageRegistries": f"{{{REGISTRY}}}",
                "policies.tenants[0].namespace": namespace,
                "policies.tenants[0].gpus": "4",
                "policies.tenants[0].gpuTypes": "{L4-24GB}",
                "policies.tenants[0].maxGpusPerReplica": "1",
            },
            namespace=PLATFORM,
        )
        if o["kind"] in POLICY_KINDS and o["metadata"]["name"].startswith(("inferfleet-",))
    ]
    text = yaml.safe_dump_all(objects)
    yield objects
    kubectl.run("delete", "--ignore-not-found", "-f", "-", stdin=text, check=False)


def test_policies_refuse_bad_model_deployments_at_apply_with_their_message(
    kubectl: Kubectl, namespace: str, policies: list[dict[str, Any]]
) -> None:
    # Made before the policies: its extraArgs would be refused now.
    older = _model_deployment("older", extraArgs=["--trust-remote-code"])
    assert _apply(kubectl, namespace, older) == ""
    kubectl.run("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(policies))
    kinds = sorted(o["kind"] for o in policies)
    assert kinds.count("ValidatingAdmissionPolicy") == 3, kinds

    elsewhere = _model_deployment("elsewhere", image="docker.io/someone/vllm:latest")
    # The API server compiles a new policy and starts its informers before it enforces it.
    assert wait_until(lambda: _apply(kubectl, namespace, elsewhere, dry_run=True) != "", 60, 1)
    refusal = _apply(kubectl, namespace, elsewhere)
    assert "ValidatingAdmissionPolicy" in refusal, refusal
    assert (
        "spec.engine.image docker.io/someone/vllm:latest is not from an allowed registry "
        f"({REGISTRY})"
    ) in refusal

    trusting = _model_deployment(
        "trusting", extraArgs=["--max-num-seqs=64", "--trust-remote-code=true"]
    )
    refusal = _apply(kubectl, namespace, trusting)
    assert "spec.engine.extraArgs may not hold --trust-remote-code=true" in refusal, refusal

    h100 = _model_deployment("h100")
    h100["spec"]["gpu"]["type"] = "H100-80GB"
    refusal = _apply(kubectl, namespace, h100)
    assert f"spec.gpu.type H100-80GB is not offered to namespace {namespace}" in refusal, refusal
    assert "(it may use L4-24GB)" in refusal

    wide = _model_deployment("wide")
    wide["spec"]["parallelism"] = {"tensor": 2}
    refusal = _apply(kubectl, namespace, wide)
    assert "a replica of 2 GPUs" in refusal, refusal
    assert f"namespace {namespace} may use per replica (1)" in refusal

    # What keeps the rules is accepted, from the allowed registry.
    assert _apply(kubectl, namespace, _model_deployment("fine", image=f"{REGISTRY}/sim:1")) == ""
    # The older object can still be annotated (a pin, a note): its engine did not change.
    assert (
        kubectl.run(
            "annotate",
            "mdep",
            "older",
            "-n",
            namespace,
            "team.example.com/owner=search",
            check=False,
        ).returncode
        == 0
    )
    # Changing the engine is checked like a new object.
    older["spec"]["engine"]["extraArgs"] = ["--trust_remote_code"]
    refusal = _apply(kubectl, namespace, older)
    assert "spec.engine.extraArgs may not hold --trust_remote_code" in refusal, refusal

    quota = kubectl.json("get", "resourcequota", "-n", namespace)["items"]
    assert [q["spec"]["hard"] for q in quota] == [{"requests.nvidia.com/gpu": "4"}], json.dumps(
        quota
    )
    classes = kubectl.json("get", "priorityclass", "inferfleet-interactive", "inferfleet-batch")
    assert [c["value"] for c in classes["items"]] == [100000, 1000]
