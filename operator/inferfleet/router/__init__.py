"""The router of an InferenceService: an OpenAI-compatible streaming proxy that chooses
replicas by load and prefix, hands prefill over to decode, and counts each request's SLO outcome."""
