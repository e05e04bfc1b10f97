"""Engine emulation and fleet simulation on CPU: vLLM's scheduling, timed by `planning`."""
