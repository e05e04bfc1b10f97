"""inferfleet: a Kubernetes operator and control plane for LLM inference fleets."""

__version__ = "0.1.0"
