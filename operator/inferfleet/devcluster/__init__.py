"""A local Kubernetes control plane for GPU-less fleets: real API server, controllers and
scheduler, with kwok playing the kubelets of fake GPU nodes."""
