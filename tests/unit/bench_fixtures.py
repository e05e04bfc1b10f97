"""A tiny autoscaling scenario shared by the benchmark tests: a load step on one GPU type."""

from __future__ import annotations

_TINY_SCENARIO = """
apiVersion: inferfleet.io/v1alpha1
kind: AutoscaleScenario
spec: {name: tiny, pattern: step, rate: 1, durationS: 240, inputTokens: "1000", outputTokens: "100",
       patternOptions: {rate_after: 16, switch_s: 100}, coldStartS: 30}
---
apiVersion: inferfleet.io/v1alpha1
kind: ModelDeployment
metadata: {name: tiny}
spec:
  model: {name: llama-3.1-8b, source: "hf://meta-llama/Llama-3.1-8B-Instruct"}
  engine: {name: sim}
  batching: {maxModelLength: 8192}
  gpu: {type: GPU}
---
apiVersion: inferfleet.io/v1alpha1
kind: InferenceService
metadata: {name: tiny}
spec:
  deployments: [{name: tiny}]
  slo: {ttftP95Ms: 1000, tpotP95Ms: 50, attainmentTarget: 0.95}
  autoscaling: {policy: goodput, aggregated: {minReplicas: 1, maxReplicas: 8}}
"""


def tiny_scenario(gpu: str = "L40S-48GB") -> str:
    """The scenario's YAML with its ModelDeployment on `gpu`."""
    return _TINY_SCENARIO.replace("type: GPU", f"type: {gpu}")
