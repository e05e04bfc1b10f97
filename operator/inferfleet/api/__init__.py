"""The inferfleet API: typed resources, their validation rules and the CRDs generated from them."""

from inferfleet.api.common import API_GROUP, API_VERSION, Condition, ConditionStatus
from inferfleet.api.inference_service import InferenceService, InferenceServiceSpec
from inferfleet.api.model_deployment import ModelDeployment, ModelDeploymentSpec

__all__ = [
    "API_GROUP",
    "API_VERSION",
    "Condition",
    "ConditionStatus",
    "InferenceService",
    "InferenceServiceSpec",
    "ModelDeployment",
    "ModelDeploymentSpec",
]
