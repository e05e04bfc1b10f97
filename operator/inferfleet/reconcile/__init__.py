"""The operator: kopf handlers that reconcile ModelDeployments and InferenceServices."""
