"""Times engine steps of the planned cases on this machine's CUDA GPU (PyTorch, no engine).

Runs where the project is not installed: it imports PyTorch and the standard library only.
`python -m benchmarks.gpu_roofline.measure PLAN --out RESULTS [--only MODEL/WEIGHTS]`.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.nn.attention.bias import causal_lower_right


def _graph_seconds(step: Callable[[], object], budget_s: float = 0.6) -> float:
    """Median seconds of one replay of `step` captured as a CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    torch.cuda.synchronize()
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    once = start.elapsed_time(end) / 1000
    samples: list[float] = []
    for _ in range(max(3, min(30, int(budget_s / max(once, 1e-6))))):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1000)
    del graph
    return statistics.median(samples)


class _Stack:
    """A Llama decoder stack of one model's shapes, random weights, on the GPU."""

    def __init__(self, shape: dict[str, int], weights: str) -> None:
        self.shape = shape
        self.fp8 = weights == "fp8"
        h, d = shape["hidden"], shape["head_dim"]
        qkv_out = (shape["heads"] + 2 * shape["kv_heads"]) * d
        dims = {
            "qkv": (qkv_out, h),
            "o": (h, shape["heads"] * d),
            "gate_up": (2 * shape["intermediate"], h),
            "down": (h, shape["intermediate"]),
        }
        self.layers = [
            {name: self._weight(rows, cols) for name, (rows, cols) in dims.items()}
            for _ in range(shape["layers"])
        ]
        bf16 = torch.bfloat16
        self.norm = torch.ones(h, device="cuda", dtype=bf16)
        self.head = torch.randn(shape["vocab"], h, device="cuda", dtype=bf16) * 0.02
        self.one = torch.ones((), device="cuda", dtype=torch.float32)

    def _weight(self, rows: int, cols: int) -> Any:
        w = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16) * 0.02
        return w.to(torch.float8_e4m3fn) if self.fp8 else w

    def linear(self, x: Any, w: Any) -> Any:
        if not self.fp8:
            return torch.nn.functional.linear(x, w)
        # Per-tensor scales, fast accumulation: the FP8 GEMM engines run on Hopper.
        return torch._scaled_mm(
            x.to(torch.float8_e4m3fn),
            w.t(),
            scale_a=self.one,
            scale_b=self.one,
            out_dtype=torch.bfloat16,
            use_fast_accum=True,
        )

    def gemms(self, x: Any, act: Any, decode_rows: int) -> None:
        for layer in self.layers:
            self.linear(x, layer["qkv"])
            self.linear(x, layer["o"])
            self.linear(x, layer["gate_up"])
            self.linear(act, layer["down"])
        if decode_rows:
            torch.nn.functional.linear(x[:decode_rows], self.head)


class _Attention:
    """The attention of one step: decodes over a dense KV cache, prompt chunks causal."""

    def __init__(self, shape: dict[str, int], case: dict[str, Any]) -> None:
        self.shape = shape
        self.decode_kernel = "sdpa"
        self.prefix_kernel = "mask"
        self.parts: tuple[str, ...] = ("decode", "prefill")
        self.sequences, self.context = case["decode_sequences"], case["decode_context"]
        self.prompts, self.chunk = case["prefill_prompts"], case["prefill_chunk"]
        self.start = case["prefill_start"]
        kv, d = shape["kv_heads"], shape["head_dim"]
        bf16 = torch.bfloat16
        # Distinct caches per layer, or enough of them that each layer reads past the L2.
        per_layer = 2 * self.sequences * kv * self.context * d * 2
        buffers = min(shape["layers"], max(4, math.ceil(2e9 / max(per_layer, 1))))
        self.caches = [
            torch.randn(2, self.sequences, kv, self.context, d, device="cuda", dtype=bf16)
            for _ in range(buffers if self.sequences else 0)
        ]
        self.prefix = (
            torch.randn(2, self.prompts, kv, self.start, d, device="cuda", dtype=bf16)
            if self.start
            else None
        )

    def __call__(self, qkv: Any, layer: int) -> Any:
        shape = self.shape
        sdpa = torch.nn.functional.scaled_dot_product_attention
        heads, kv, d = shape["heads"], shape["kv_heads"], shape["head_dim"]
        group = heads // kv
        parts = []
        if self.sequences and "decode" in self.parts:
            b = self.sequences
            # A decode's query heads grouped by the K/V head they share: each head read once.
            q = qkv[:b, : heads * d].reshape(b, kv, group, d)
            cache = self.caches[layer % len(self.caches)]
            if self.decode_kernel == "sdpa":
                out = sdpa(q, cache[0], cache[1])
            else:
                out = _split_kv_attention(q, cache[0], cache[1])
            parts.append(out.reshape(b, heads * d))
        if self.prompts and "prefill" in self.parts:
            n, c, b = self.prompts, self.chunk, self.sequences
            rows = qkv[b : b + n * c]
            q = rows[:, : heads * d].reshape(n, c, heads, d).transpose(1, 2)
            k = rows[:, heads * d : (heads + kv) * d].reshape(n, c, kv, d).transpose(1, 2)
            v = rows[:, (heads + kv) * d :].reshape(n, c, kv, d).transpose(1, 2)
            if self.prefix is not None and self.prefix_kernel == "join":
                out = _chunk_after_prefix(q, k, v, self.prefix)
            elif self.prefix is not None:
                k = torch.cat([self.prefix[0], k], dim=2).repeat_interleave(group, dim=1)
                v = torch.cat([self.prefix[1], v], dim=2).repeat_interleave(group, dim=1)
                out = sdpa(q, k, v, attn_mask=causal_lower_right(c, self.start + c))
            else:
                k = k.repeat_interleave(group, dim=1)
                v = v.repeat_interleave(group, dim=1)
                out = sdpa(q, k, v, is_causal=True)
            parts.append(out.transpose(1, 2).reshape(n * c, heads * d))
        return parts[0] if len(parts) == 1 else torch.cat(parts)


def _flash_with_lse() -> bool:
    """Whether PyTorch's FlashAttention entry point (which returns the log-sum-exp that joins
    two attention parts) runs here."""
    try:
        x = torch.randn(1, 1, 16, 64, device="cuda", dtype=torch.bfloat16)
        torch.ops.aten._scaled_dot_product_flash_attention(x, x, x)
    except (RuntimeError, AttributeError):
        return False
    return True


_FLASH_WITH_LSE = torch.cuda.is_available() and _flash_with_lse()


def _chunk_after_prefix(q: Any, k: Any, v: Any, prefix: Any) -> Any:
    """A prompt chunk's attention (chunked prefill): its queries against the prompt's earlier
    positions, all visible, and against the chunk itself, causal; the two joined by their
    log-sum-exps, as paged prefill kernels do. Against the prefix, the query heads that share
    a K/V head ride in its sequence dimension, so the prefix is read once per K/V head."""
    flash = torch.ops.aten._scaled_dot_product_flash_attention
    n, heads, c, d = q.shape
    kv = k.shape[1]
    group = heads // kv
    grouped = q.reshape(n, kv, group * c, d)
    before, before_lse = flash(grouped, prefix[0], prefix[1])[:2]
    own, own_lse = flash(
        q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1), is_causal=True
    )[:2]
    before = before.reshape(n, heads, c, d)
    before_lse = before_lse.reshape(n, heads, c)
    peak = torch.maximum(before_lse, own_lse)
    w_before = torch.exp(before_lse - peak).unsqueeze(-1)
    w_own = torch.exp(own_lse - peak).unsqueeze(-1)
    return ((before * w_before + own * w_own) / (w_before + w_own)).to(torch.bfloat16)


def _split_kv_attention(q: Any, k: Any, v: Any) -> Any:
    """Decode attention split along the context (flash-decoding): each split's partial softmax
    and output by batched GEMMs, combined by their maxima, so that a few long sequences still
    spread over every multiprocessor. The split count divides the context, so that the splits
    are views of the cache."""
    b, kv, _, d = q.shape
    context = k.shape[2]
    processors = torch.cuda.get_device_properties(0).multi_processor_count
    splits = max(1, min(context // 256, math.ceil(16 * processors / (b * kv))))
    while context % splits:
        splits -= 1
    ks = k.reshape(b, kv, splits, context // splits, d)
    vs = v.reshape(b, kv, splits, context // splits, d)
    scores = torch.matmul(q.unsqueeze(2), ks.transpose(-1, -2)) * d**-0.5
    peak = scores.amax(-1, keepdim=True)
    weights = torch.exp(scores - peak)
    total = weights.sum(-1, keepdim=True, dtype=torch.float32)
    partial = torch.matmul(weights, vs)
    scale = torch.exp((peak - peak.amax(2, keepdim=True)).float())
    out = (partial * scale).sum(2) / (total * scale).sum(2)
    return out.to(torch.bfloat16)


def _measure_case(stack: _Stack, case: dict[str, Any]) -> dict[str, float]:
    shape = stack.shape
    f = torch.nn.functional
    rows = case["decode_sequences"] + case["prefill_prompts"] * case["prefill_chunk"]
    padded = -(-rows // 16) * 16 if stack.fp8 else rows  # FP8 GEMMs take multiples of 16 rows
    h, inter = shape["hidden"], shape["intermediate"]
    x = torch.randn(padded, h, device="cuda", dtype=torch.bfloat16)
    act = torch.randn(padded, inter, device="cuda", dtype=torch.bfloat16)
    qkv_width = (shape["heads"] + 2 * shape["kv_heads"]) * shape["head_dim"]
    qkv_static = torch.randn(padded, qkv_width, device="cuda", dtype=torch.bfloat16)
    attention = _Attention(shape, case)
    decode_rows = case["decode_sequences"]

    def full() -> None:
        y = x
        for i, layer in enumerate(stack.layers):
            hidden = f.rms_norm(y, (h,), stack.norm)
            qkv = stack.linear(hidden, layer["qkv"])
            attn = attention(qkv, i)
            if padded > rows:
                attn = f.pad(attn, (0, 0, 0, padded - rows))
            y = y + stack.linear(attn, layer["o"])
            hidden = f.rms_norm(y, (h,), stack.norm)
            gate, up = stack.linear(hidden, layer["gate_up"]).split(inter, dim=-1)
            y = y + stack.linear(f.silu(gate) * up, layer["down"])
        if decode_rows:
            f.linear(f.rms_norm(y[:decode_rows], (h,), stack.norm), stack.head)

    def attention_only() -> None:
        for i in range(shape["layers"]):
            attention(qkv_static, i)

    result: dict[str, float] = {}
    if decode_rows:
        # The faster of two decode kernels times the step: PyTorch's SDPA and split-KV.
        attention.parts = ("decode",)
        for kernel in ("sdpa", "split"):
            attention.decode_kernel = kernel
            result[f"decode_attention_{kernel}_s"] = _graph_seconds(attention_only)
        faster = min(("sdpa", "split"), key=lambda k: result[f"decode_attention_{k}_s"])
        attention.decode_kernel = faster
    if case["prefill_prompts"]:
        # After a prefix, the faster of SDPA with a causal mask and FlashAttention in two parts.
        attention.parts = ("prefill",)
        kernels = ("mask", "join") if case["prefill_start"] and _FLASH_WITH_LSE else ("mask",)
        for kernel in kernels:
            attention.prefix_kernel = kernel
            result[f"prefill_attention_{kernel}_s"] = _graph_seconds(attention_only)
        attention.prefix_kernel = min(kernels, key=lambda k: result[f"prefill_attention_{k}_s"])
        result["prefill_attention_s"] = result[f"prefill_attention_{attention.prefix_kernel}_s"]
    attention.parts = ("decode", "prefill")
    decode_s = min(result.get(f"decode_attention_{k}_s", 0.0) for k in ("sdpa", "split"))
    result["attention_s"] = decode_s + result.get("prefill_attention_s", 0.0)
    result["step_s"] = _graph_seconds(full)
    result["gemm_s"] = _graph_seconds(lambda: stack.gemms(x, act, decode_rows))
    torch.cuda.empty_cache()
    return result


def _ceilings() -> dict[str, float | str]:
    """What this GPU reaches on large, simple kernels: the peaks the efficiencies stand on."""
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t()
    one = torch.ones((), device="cuda", dtype=torch.float32)
    src = torch.empty(2**31, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    kernels: dict[str, tuple[float, Callable[[], object]]] = {
        "bf16_gemm_flops": (2 * n**3, lambda: a @ b),
        "fp8_gemm_flops": (
            2 * n**3,
            lambda: torch._scaled_mm(
                a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=True
            ),
        ),
        "copy_bytes_per_s": (2 * src.numel() * src.element_size(), lambda: dst.copy_(src)),
    }
    reached: dict[str, float | str] = {}
    for name, (work, kernel) in kernels.items():
        try:
            reached[name] = work / _graph_seconds(kernel)
        except Exception as error:  # a missing kernel must not lose the cases
            reached[name] = f"{type(error).__name__}: {error}"[:300]
    return reached


def measure(plan_path: Path, out_path: Path, only: str | None) -> None:
    planned = json.loads(plan_path.read_text())
    properties = torch.cuda.get_device_properties(0)
    results: dict[str, Any] = {
        "plan": planned,
        "device": properties.name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "ceilings": _ceilings(),
        "cases": [],
    }
    print(json.dumps({k: results[k] for k in ("device", "torch", "cuda", "ceilings")}), flush=True)
    groups = dict.fromkeys((c["model"], c["weights"]) for c in planned["cases"])
    for model, weights in groups:
        if only and only != f"{model}/{weights}":
            continue
        cases = [c for c in planned["cases"] if (c["model"], c["weights"]) == (model, weights)]
        began = time.monotonic()
        stack = _Stack(planned["models"][model], weights)
        for case in cases:
            timed: Mapping[str, float | str]
            try:
                timed = _measure_case(stack, case)
            except Exception as error:  # one failed case must not lose the rest
                timed = {"error": f"{type(error).__name__}: {error}"[:300]}
                torch.cuda.empty_cache()
            results["cases"].append({**case, **timed})
            print(json.dumps(results["cases"][-1]), flush=True)
            out_path.write_text(json.dumps(results, indent=1))
        print(f"{model}/{weights}: {time.monotonic() - began:.0f} s", flush=True)
        del stack
        torch.cuda.empty_cache()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_roofline.measure")
    parser.add_argument("plan", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", help="one MODEL/WEIGHTS, e.g. llama-3.1-8b/fp8")
    args = parser.parse_args(argv)
    measure(args.plan, args.out, args.only)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
