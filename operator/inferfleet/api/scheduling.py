"""Where a ModelDeployment's engine pods may run, and what else they ask of a node: a narrow,
validated overlay of the pod fields platform teams set (node labels and affinity, taints,
priority, pull secrets, host CPU and memory), not a free pod template. GPUs, the GPU type's
node label and the GPU taint stay the operator's: the plan depends on them."""

from __future__ import annotations

import re
from decimal import Decimal
from enum import StrEnum
from typing import Annotated, Final

from pydantic import Field, StringConstraints

from inferfleet.api.common import CrossFieldRule, WireModel

# A label key: an optional DNS-subdomain prefix and a name of up to 63 characters.
LABEL_KEY_PATTERN: Final = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LABEL_VALUE_PATTERN: Final = r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$"
# A Kubernetes object name (PriorityClass, Secret): a DNS subdomain.
OBJECT_NAME_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# Plain decimal quantities with an SI or binary suffix ("8", "500m", "64Gi"): the forms a
# request is written in; no exponents, so that one comparison rule holds on both sides.
QUANTITY_PATTERN: Final = r"^[0-9]{1,15}(\.[0-9]{1,9})?(m|k|M|G|T|P|Ki|Mi|Gi|Ti|Pi)?$"

LabelKey = Annotated[
    str, StringConstraints(min_length=1, max_length=317, pattern=LABEL_KEY_PATTERN)
]
LabelValue = Annotated[str, StringConstraints(max_length=63, pattern=LABEL_VALUE_PATTERN)]
ObjectName = Annotated[
    str, StringConstraints(min_length=1, max_length=253, pattern=OBJECT_NAME_PATTERN)
]
Quantity = Annotated[str, StringConstraints(min_length=1, max_length=32, pattern=QUANTITY_PATTERN)]

_SUFFIXES: Final[dict[str, Decimal]] = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
}


def quantity_value(text: str) -> Decimal:
    """The number a `QUANTITY_PATTERN` quantity stands for ("64Gi" -> 68719476736)."""
    number = text.rstrip("mkMGTPi")
    suffix = text[len(number) :]
    return Decimal(number) * _SUFFIXES[suffix]


class TolerationOperator(StrEnum):
    EQUAL = "Equal"
    EXISTS = "Exists"


class TaintEffect(StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class Toleration(WireModel):
    """A taint the engine pods tolerate (core/v1 Toleration), beyond the GPU taint the operator
    always tolerates."""

    key: LabelKey | None = Field(
        default=None, description="Taint key; absent with operator Exists: every taint."
    )
    operator: TolerationOperator = Field(
        default=TolerationOperator.EQUAL,
        strict=False,
        description="Equal (the taint's value is `value`) or Exists (any value).",
    )
    value: LabelValue | None = Field(default=None, description="Taint value, with Equal.")
    effect: TaintEffect | None = Field(
        default=None,
        strict=False,
        description="NoSchedule, PreferNoSchedule or NoExecute; absent: every effect.",
    )
    toleration_seconds: int | None = Field(
        default=None,
        ge=0,
        le=2**31 - 1,
        description="With NoExecute: how long a pod stays on a node after the taint is added.",
    )


Toleration.cross_field_rules = (
    CrossFieldRule(
        cel="self.operator == 'Exists' || has(self.key)",
        message="a toleration without a key must use operator Exists",
        holds=lambda t: t.operator == TolerationOperator.EXISTS or t.key is not None,
        field_path=".operator",
    ),
    CrossFieldRule(
        cel="self.operator != 'Exists' || !has(self.value)",
        message="a toleration with operator Exists takes no value",
        holds=lambda t: t.operator != TolerationOperator.EXISTS or t.value is None,
        field_path=".value",
    ),
    CrossFieldRule(
        cel="!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
        message="tolerationSeconds applies to effect NoExecute only",
        holds=lambda t: t.toleration_seconds is None or t.effect == TaintEffect.NO_EXECUTE,
        field_path=".tolerationSeconds",
    ),
)


class NodeOperator(StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"
    GT = "Gt"
    LT = "Lt"


class NodeRequirement(WireModel):
    """One condition on a node's labels (core/v1 NodeSelectorRequirement)."""

    key: LabelKey = Field(description="Node label key.")
    operator: NodeOperator = Field(
        strict=False, description="In, NotIn, Exists, DoesNotExist, Gt or Lt."
    )
    values: list[LabelValue] = Field(
        default_factory=list,
        max_length=64,
        description="Label values: one or more for In and NotIn, none for Exists and "
        "DoesNotExist, one integer for Gt and Lt.",
    )


_WITH_VALUES: Final = (NodeOperator.IN, NodeOperator.NOT_IN)
_COMPARED: Final = (NodeOperator.GT, NodeOperator.LT)

NodeRequirement.cross_field_rules = (
    CrossFieldRule(
        cel="!(self.operator in ['In', 'NotIn']) || (has(self.values) && size(self.values) > 0)",
        message="operators In and NotIn need one or more values",
        holds=lambda r: r.operator not in _WITH_VALUES or bool(r.values),
        field_path=".values",
    ),
    CrossFieldRule(
        cel="!(self.operator in ['Exists', 'DoesNotExist']) || !has(self.values) || "
        "size(self.values) == 0",
        message="operators Exists and DoesNotExist take no values",
        holds=lambda r: r.operator in _WITH_VALUES or r.operator in _COMPARED or not r.values,
        field_path=".values",
    ),
    CrossFieldRule(
        cel="!(self.operator in ['Gt', 'Lt']) || (has(self.values) && "
        "size(self.values) == 1 && self.values[0].matches('^-?[0-9]+$'))",
        message="operators Gt and Lt take one integer value",
        holds=lambda r: (
            r.operator not in _COMPARED
            or (len(r.values) == 1 and r.values[0].lstrip("-").isdigit())
        ),
        field_path=".values",
    ),
)


class NodeTerm(WireModel):
    """Requirements that all hold on a node."""

    match_expressions: list[NodeRequirement] = Field(
        min_length=1, max_length=16, description="Every one must hold."
    )


class PreferredNodeTerm(WireModel):
    weight: int = Field(ge=1, le=100, description="How much a node that matches is preferred.")
    match_expressions: list[NodeRequirement] = Field(
        min_length=1, max_length=16, description="Every one must hold."
    )


class NodeAffinity(WireModel):
    """Node affinity beyond the GPU type (core/v1 NodeAffinity)."""

    required: list[NodeTerm] = Field(
        default_factory=list,
        max_length=8,
        description="A node must match one of these terms (requiredDuringSchedulingIgnored"
        "DuringExecution).",
    )
    preferred: list[PreferredNodeTerm] = Field(
        default_factory=list,
        max_length=8,
        description="Nodes matching these terms are preferred, by weight "
        "(preferredDuringSchedulingIgnoredDuringExecution).",
    )


class EngineResources(WireModel):
    """Host CPU and memory of an engine container, where the planner's defaults (CPUs and
    memory in proportion to the GPUs and the weights) do not suit a node type."""

    cpu: Quantity | None = Field(default=None, description="CPU request, e.g. 16 or 3500m.")
    memory: Quantity | None = Field(default=None, description="Memory request, e.g. 128Gi.")
    memory_limit: Quantity | None = Field(
        default=None,
        description="Memory limit; absent: twice the request. No CPU limit is ever set "
        "(throttling would slow every step).",
    )


EngineResources.cross_field_rules = (
    CrossFieldRule(
        cel="!has(self.memory) || !has(self.memoryLimit) || "
        "quantity(self.memoryLimit).compareTo(quantity(self.memory)) >= 0",
        message="memoryLimit must be at least memory",
        holds=lambda r: (
            r.memory is None
            or r.memory_limit is None
            or quantity_value(r.memory_limit) >= quantity_value(r.memory)
        ),
        field_path=".memoryLimit",
    ),
)


class SchedulingSpec(WireModel):
    node_selector: dict[str, LabelValue] = Field(
        default_factory=dict,
        max_length=16,
        description="Node labels the engine pods require, beside the GPU type's (for example "
        "a node pool or a zone).",
    )
    node_affinity: NodeAffinity | None = Field(
        default=None, description="Node affinity beyond the GPU type."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list,
        max_length=16,
        description="Taints the engine pods tolerate, beside the GPU taint.",
    )
    priority_class_name: ObjectName | None = Field(
        default=None,
        description="PriorityClass of the engine pods (for example inferfleet-interactive or "
        "inferfleet-batch, which the chart creates).",
    )
    image_pull_secrets: list[ObjectName] = Field(
        default_factory=list,
        max_length=8,
        description="Secrets in this namespace to pull the engine image with.",
    )
    spread_across: LabelKey | None = Field(
        default=None,
        description="A node label (for example topology.kubernetes.io/zone) across whose "
        "values the replicas of each role are spread as evenly as the cluster allows.",
    )
    group_topology: LabelKey | None = Field(
        default=None,
        description="For a replica that spans nodes: a node label (for example a rack's or "
        "an InfiniBand block's) whose every value holds one replica's nodes whole, and one "
        "replica only (LeaderWorkerSet's exclusive topology), so that the nodes of a replica "
        "share their network.",
    )
    resources: EngineResources | None = Field(
        default=None, description="Host CPU and memory of the engine container."
    )


_LABEL_KEY = re.compile(LABEL_KEY_PATTERN)

SchedulingSpec.cross_field_rules = (
    CrossFieldRule(
        # The schema holds the values; a map's keys are checked here.
        cel="!has(self.nodeSelector) || "
        # A raw string: CEL's plain strings take no `\.` escape.
        f"self.nodeSelector.all(k, size(k) <= 317 && k.matches(r'{LABEL_KEY_PATTERN}'))",
        message="nodeSelector keys must be label keys ([prefix/]name, the name at most 63 "
        "characters)",
        holds=lambda s: all(len(k) <= 317 and _LABEL_KEY.match(k) for k in s.node_selector),
        field_path=".nodeSelector",
    ),
)
