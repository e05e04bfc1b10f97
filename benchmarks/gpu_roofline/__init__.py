"""Engine steps on a real GPU against the planner's roofline step model.

Three steps, so that the part that needs a GPU imports nothing of the project:

* ``python -m benchmarks.gpu_roofline plan``: the cases to measure, as JSON. Model shapes
  come from the built-in catalog; the loads are a sweep of prefill chunks and decode batches
  plus the steady-state step the planner assigns to each published max-throughput point on the
  GPU named (``--gpu``);
* ``python -m benchmarks.gpu_roofline.measure PLAN``: on a CUDA GPU with PyTorch (no engine
  needed). Each case builds a Llama decoder stack with random weights of the model's shapes
  (bf16, or FP8 with per-tensor scales through ``torch._scaled_mm``), captures one engine step
  as a CUDA graph and times its replay: the whole step, its GEMMs alone and its attention
  alone. No host time enters: CUDA graphs replay without the engine's scheduler, sampler or
  kernel launches;
* ``python -m benchmarks.gpu_roofline compare RESULTS...``: the planner's linear and attention
  seconds for the same work on the measured GPU type, beside the measurements, as Markdown.

What this checks and what it does not: the kernels are PyTorch's (cuBLAS(Lt) GEMMs, PyTorch's
scaled-dot-product attention on a dense, not paged, KV cache in bf16), not an engine's fused
kernels; rotary embedding, sampling and the KV-cache writes are left out. The fitted efficiency
terms of the planner fold all of an engine's costs into two fractions of the datasheet peaks,
so the comparison says how much of each fraction the bare kernels already explain.
"""
