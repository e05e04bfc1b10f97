"""Serving benchmarks: request traces and synthetic load (`traces`), an open-loop OpenAI client
(`loadgen`) and latency, SLO attainment and goodput statistics (`report`)."""
