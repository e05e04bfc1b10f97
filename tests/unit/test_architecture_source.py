"""A ModelDeployment's architecture read from a ConfigMap (`model.architectureFrom`): the
reading itself (pure), the reconcile's outcome when it cannot be read or breaks a rule once
read, and the controller fetching the ConfigMap for the deployment's reconcile only."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferfleet.api.architecture_source import read_architecture
from inferfleet.api.catalog import catalog_models
from inferfleet.api.model_deployment import ModelDeployment
from inferfleet.reconcile import controller as controller_module
from inferfleet.reconcile.controller import Controller
from inferfleet.reconcile.desired import (
    Namespace,
    inference_service_outcome,
    model_deployment_outcome,
)
from inferfleet.render import InstallSettings
from tests.unit.test_hf_config import CONFIGS

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CONFIGMAP_EXAMPLE = "qwen3-4b-architecture-from-configmap-vllm.yaml"
CONFIG = {"config.json": json.dumps(CONFIGS["qwen3-8b"])}


def _body(**model: Any) -> dict[str, Any]:
    return {
        "apiVersion": "inferfleet.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "assistant", "namespace": "llm", "uid": "uid-md", "generation": 1},
        "spec": {
            "model": {
                "name": "my-qwen",
                "source": "hf://Qwen/Qwen3-8B",
                "architectureFrom": {"configMapKeyRef": {"name": "qwen-config"}},
            }
            | model,
            "engine": {"name": "vllm"},
            "gpu": {"type": "H100-80GB"},
        },
    }


def test_the_config_json_becomes_the_architecture_in_full() -> None:
    body = _body()
    read = read_architecture(body, CONFIG)
    assert read.problem is None
    md = ModelDeployment.model_validate(read.body)
    assert md.spec.architecture() == catalog_models()["qwen3-8b"]
    assert md.spec.model.architecture_from is None
    assert body["spec"]["model"]["architectureFrom"]  # the body given is left as it was


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (None, "ConfigMap qwen-config not found in the namespace"),
        ({"other.json": "{}"}, "has no key config.json (its keys: other.json)"),
        ({"config.json": "{"}, "key config.json is not JSON"),
        ({"config.json": "[1]"}, "is not a JSON object"),
        ({"config.json": json.dumps({"model_type": "bert"})}, "model_type 'bert' is not a family"),
    ],
)
def test_what_cannot_be_read_says_why(data: dict[str, str] | None, says: str) -> None:
    read = read_architecture(_body(), data)
    assert read.problem is not None
    assert says in read.problem
    assert read.body == _body()


def _outcome(body: dict[str, Any], problem: str | None = None) -> Any:
    return model_deployment_outcome(
        body, space=Namespace(children=[], holder=lambda _key: None), claims=(),
        unschedulable={}, install=InstallSettings(), now=NOW, architecture_problem=problem,
    )  # fmt: skip


def _ready(outcome: Any) -> dict[str, Any]:
    conditions = outcome.status["conditions"]
    return next(c for c in conditions if c["type"] == "Ready")


def test_an_architecture_not_read_applies_nothing_and_looks_again() -> None:
    problem = read_architecture(_body(), None).problem
    outcome = _outcome(_body(), problem)
    assert outcome.apply == ()
    assert outcome.delete == ()
    ready = _ready(outcome)
    assert (ready["status"], ready["reason"]) == ("False", "ArchitectureUnavailable")
    assert "qwen-config" in ready["message"]
    assert outcome.requeue_after_s == 60
    assert [(e.reason, e.warning) for e in outcome.events] == [("ArchitectureUnavailable", True)]


def test_once_read_the_deployment_is_applied_as_for_a_catalog_model() -> None:
    outcome = _outcome(dict(read_architecture(_body(), CONFIG).body))
    assert {o["kind"] for o in outcome.apply} >= {"Deployment", "Service"}
    assert _ready(outcome)["reason"] != "ArchitectureUnavailable"


def test_a_rule_the_read_architecture_breaks_is_reported_as_at_apply() -> None:
    """Admitted by the API server (the shape was not known there); refused once read: 32
    attention heads over 3 GPUs."""
    body = _body()
    body["spec"]["parallelism"] = {"tensor": 3}
    ModelDeployment.model_validate(body)
    outcome = _outcome(dict(read_architecture(body, CONFIG).body))
    assert outcome.apply == ()
    ready = _ready(outcome)
    assert ready["reason"] == "InvalidSpec"
    assert "parallelism.tensor must divide the model's attention heads" in ready["message"]


class _ConfigMaps:
    """The API server's ConfigMaps, as `Kube.get` reads them."""

    def __init__(self) -> None:
        self.stored: dict[tuple[str, str], dict[str, Any]] = {}
        self.gets = 0

    def get(self, api_version: str, kind: str, name: str, namespace: str) -> Any:
        assert (api_version, kind) == ("v1", "ConfigMap")
        self.gets += 1
        return self.stored.get((namespace, name))


def test_its_reconcile_fetches_the_configmap_and_the_others_read_what_it_fetched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api = _ConfigMaps()
    monkeypatch.setattr(controller_module, "kube", lambda: api)
    controller = Controller({}, install=InstallSettings(), autoscaler=None)
    body = _body()
    # Before its reconcile ran (a restart), a service's read fetches it.
    assert controller._read_architecture("llm", "assistant", body).problem is not None
    assert api.gets == 1
    api.stored["llm", "qwen-config"] = {"data": CONFIG}
    # The services and the autoscaler read what the deployment's reconcile last fetched.
    assert controller._read_architecture("llm", "assistant", body).problem is not None
    read, changed = controller._fetch_architecture("llm", "assistant", body)
    assert changed
    assert read.problem is None
    assert read.body["spec"]["model"]["architecture"]["layers"] == 36
    assert controller._read_architecture("llm", "assistant", body).body == read.body
    assert controller._fetch_architecture("llm", "assistant", body) == (read, False)
    assert api.gets == 3
    # A deployment that names no ConfigMap reads nothing.
    plain = _body()
    del plain["spec"]["model"]["architectureFrom"]
    assert controller._fetch_architecture("llm", "plain", plain) == (
        read_architecture(plain, None),
        False,
    )
    assert api.gets == 3


def test_a_service_whose_backend_is_not_read_renders_nothing_and_says_why() -> None:
    docs = list(yaml.safe_load_all((EXAMPLES / CONFIGMAP_EXAMPLE).read_text()))
    (service,) = [d for d in docs if d["kind"] == "InferenceService"]
    (deployment,) = [d for d in docs if d["kind"] == "ModelDeployment"]
    service["metadata"] |= {"namespace": "llm", "uid": "uid-svc", "generation": 1}
    outcome = inference_service_outcome(
        service, space=Namespace(children=[], holder=lambda _key: None),
        backends={"qwen3-4b": deployment}, install=InstallSettings(), now=NOW,
    )  # fmt: skip
    assert outcome.apply == ()
    assert outcome.delete == ()
    ready = _ready(outcome)
    assert ready["reason"] == "BackendsNotReady"
    assert "architecture not read: qwen3-4b" in ready["message"]
