"""The specs the golden files are rendered from: the repository's examples, plus variants that
exercise what the examples do not (other engines, int4, speculation, volume sources)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from inferfleet.api.architecture_source import architecture_source, read_architecture
from inferfleet.api.inference_service import InferenceService
from inferfleet.api.model_deployment import ModelDeployment, ModelDeploymentSpec

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
AGGREGATED_EXAMPLE = "llama-3.1-8b-aggregated-vllm.yaml"
DISAGGREGATED_EXAMPLE = "llama-3.3-70b-fp8-disaggregated-trtllm.yaml"

Wire = dict[str, Any]


def example(file: str) -> tuple[Wire, Wire]:
    """The (ModelDeployment, InferenceService) documents of an example, as wire dicts; an
    architecture the ModelDeployment reads from a ConfigMap of the file read into it, as the
    operator reads it."""
    docs = list(yaml.safe_load_all((EXAMPLES / file).read_text("utf-8")))
    (md,) = [d for d in docs if d["kind"] == "ModelDeployment"]
    (isvc,) = [d for d in docs if d["kind"] == "InferenceService"]
    source = architecture_source(md)
    if source is not None:
        (config,) = [d for d in docs if d["kind"] == "ConfigMap"]
        read = read_architecture(md, config["data"])
        assert read.problem is None, read.problem
        md = dict(read.body)
    return md, isvc


def merged(base: Mapping[str, Any], changes: Mapping[str, Any]) -> Wire:
    """`base` with `changes` merged in, recursively; a None value deletes the key."""
    result = copy.deepcopy(dict(base))
    for key, value in changes.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, Mapping):
            base_value = result.get(key)
            result[key] = merged(base_value if isinstance(base_value, Mapping) else {}, value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def aggregated_spec(**changes: Any) -> ModelDeploymentSpec:
    """The aggregated example's spec (Llama-3.1-8B, vLLM, H100), with `changes` merged."""
    md, _ = example(AGGREGATED_EXAMPLE)
    return ModelDeploymentSpec.model_validate(merged(md["spec"], changes))


def disaggregated_spec(**changes: Any) -> ModelDeploymentSpec:
    """The disaggregated example's spec (Llama-3.3-70B FP8, TensorRT-LLM, 2 x H100)."""
    md, _ = example(DISAGGREGATED_EXAMPLE)
    return ModelDeploymentSpec.model_validate(merged(md["spec"], changes))


def model_deployment(
    spec: ModelDeploymentSpec,
    name: str = "llama",
    namespace: str | None = "serving",
    uid: str | None = "6f1c2d4e-0000-4000-8000-000000000001",
) -> ModelDeployment:
    metadata: dict[str, object] = {"name": name, "generation": 3}
    if namespace is not None:
        metadata["namespace"] = namespace
    if uid is not None:
        metadata["uid"] = uid
    return ModelDeployment(metadata=metadata, spec=spec)


def example_objects(
    file: str, namespace: str = "serving"
) -> tuple[ModelDeployment, InferenceService]:
    """An example as stored by the API server: namespaced, with uids and generations."""
    md, isvc = example(file)
    md["metadata"] |= {"namespace": namespace, "uid": "uid-md-1", "generation": 1}
    isvc["metadata"] |= {"namespace": namespace, "uid": "uid-isvc-1", "generation": 1}
    return ModelDeployment.model_validate(md), InferenceService.model_validate(isvc)


INT4_AWQ: Wire = {
    "model": {"name": "qwen2.5-72b", "source": "hf://Qwen/Qwen2.5-72B-Instruct-AWQ"},
    "precision": {"weights": "int4", "method": "awq", "kvCache": "auto"},
    "parallelism": {"tensor": 2},
    "batching": {"maxModelLength": 32768},
}
EAGLE3: Wire = {
    "speculativeDecoding": {
        "method": "eagle3",
        "draftModel": "hf://yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
        "numTokens": 4,
    }
}
EAGLE: Wire = {
    "speculativeDecoding": {
        "method": "eagle",
        "draftModel": "hf://yuhuili/EAGLE-LLaMA3.1-Instruct-8B",
        "numTokens": 3,
    }
}
PVC_NGRAM: Wire = {
    "model": {"source": "pvc://model-store/meta-llama/Llama-3.1-8B-Instruct"},
    "precision": {"weights": "fp8", "method": "fp8", "kvCache": "fp8"},
    "batching": {"chunkedPrefill": False, "maxBatchedTokens": 32768},
    "prefixCaching": False,
    "speculativeDecoding": {"method": "ngram", "numTokens": 5},
    "engine": {"extraArgs": ["--enforce-eager"]},
}
PVC_DRAFT_MODEL: Wire = {
    "model": {"source": "pvc://model-store/meta-llama/Llama-3.1-8B-Instruct"},
    "speculativeDecoding": {
        "method": "draft-model",
        "draftModel": "pvc://drafts/llama-3.2-1b-instruct",
        "numTokens": 4,
    },
    "engine": {"name": "tensorrt-llm", "version": "1.2.0"},
}
CUSTOM_ARCHITECTURE: Wire = {
    "model": {
        "name": "tiny-llama",
        "source": "s3://models/tiny-llama",
        "architecture": {
            "parameterCount": 1_100_048_384,
            "layers": 22,
            "hiddenSize": 2048,
            "attentionHeads": 32,
            "kvHeads": 4,
            "headDim": 64,
            "intermediateSize": 5632,
            "vocabSize": 32000,
            "maxContextLength": 2048,
        },
    },
    "engine": {"name": "sim", "extraArgs": ["--seed", "7"]},
    "gpu": {"type": "L4-24GB"},
    "batching": {"maxModelLength": None},
}
