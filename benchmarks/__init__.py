"""Benchmarks that run the operator on the local dev cluster (`python -m benchmarks.<name>`)."""
