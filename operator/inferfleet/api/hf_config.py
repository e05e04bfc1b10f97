"""A model's architecture from its Hugging Face `config.json`: how a model the catalog does not
know is served without a code change (`inferfleet architecture config.json` prints the
`model.architecture` block of a ModelDeployment). Pure: the caller reads the file.

A `config.json` gives shapes, not parameter counts: they are counted here from the shapes, for
the decoder families whose layout is known (`FAMILIES`), embeddings, norms and biases included,
so that the counts match the published checkpoints (the catalog's entries are checked against
their own configs in the tests). Any other `model_type` is refused with the families known:
a count guessed from a layout that differs (shared experts of another shape, attention of
another kind) would misplan memory silently.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from inferfleet.api.catalog import ModelArchitecture


@dataclass(frozen=True)
class _Layout:
    """How one family lays out a decoder layer beyond the common shape."""

    qkv_bias: bool = False
    """Biases on the q, k and v projections (Qwen2)."""
    attention_bias: bool = False
    """Biases on every attention projection and a per-head sink (gpt-oss)."""
    qk_norm: bool = False
    """RMS norms on queries and keys, one weight vector of head_dim each (Qwen3)."""
    expert_bias: bool = False
    """Biases on the experts' projections and the router (gpt-oss)."""


FAMILIES: Final[Mapping[str, _Layout]] = {
    "llama": _Layout(),
    "mistral": _Layout(),
    "mixtral": _Layout(),
    "qwen2": _Layout(qkv_bias=True),
    "qwen3": _Layout(qk_norm=True),
    "qwen3_moe": _Layout(qk_norm=True),
    "gpt_oss": _Layout(attention_bias=True, expert_bias=True),
}

# Multi-head latent attention with DeepSeek-V3's mixture of experts: the first
# `first_k_dense_replace` layers dense, every later one routed experts plus shared ones of the
# same width (DeepSeek-V3 and DeepSeek-R1 publish this model_type).
LATENT_ATTENTION_FAMILIES: Final = frozenset({"deepseek_v3"})

_EXPERTS_KEYS: Final = ("num_local_experts", "num_experts")
_TOP_K_KEYS: Final = ("num_experts_per_tok", "experts_per_token")


class UnsupportedConfigError(ValueError):
    """A config.json whose architecture cannot be counted; the message says why."""


def _int(config: Mapping[str, Any], *keys: str, default: int | None = None) -> int:
    """The first of `keys` the config has, a positive integer; `default` where it has none."""
    for key in keys:
        value = config.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UnsupportedConfigError(f"config.json: {key} is {value!r}, not a positive integer")
        return value
    if default is not None:
        return default
    raise UnsupportedConfigError(f"config.json has no {' or '.join(keys)}")


def architecture_from_hf_config(config: Mapping[str, Any]) -> ModelArchitecture:
    """The ModelArchitecture of a decoder-only model from its config.json."""
    family = config.get("model_type")
    if family in LATENT_ATTENTION_FAMILIES:
        return _latent_attention_architecture(config)
    layout = FAMILIES.get(str(family))
    if layout is None:
        known = ", ".join(sorted([*FAMILIES, *LATENT_ATTENTION_FAMILIES]))
        raise UnsupportedConfigError(
            f"model_type {family!r} is not a family whose parameters can be counted from its "
            f"config ({known}); give model.architecture in full"
        )
    hidden = _int(config, "hidden_size")
    layers = _int(config, "num_hidden_layers")
    heads = _int(config, "num_attention_heads")
    kv_heads = _int(config, "num_key_value_heads", default=heads)
    head_dim = _int(config, "head_dim", default=hidden // heads)
    vocab = _int(config, "vocab_size")
    experts = _int(config, *_EXPERTS_KEYS, default=1)
    if experts > 1 and (config.get("mlp_only_layers") or config.get("decoder_sparse_step", 1) != 1):
        raise UnsupportedConfigError(
            "a mixture of experts with dense layers among its sparse ones (mlp_only_layers, "
            "decoder_sparse_step) is not counted; give model.architecture in full"
        )
    top_k = _int(config, *_TOP_K_KEYS, default=1) if experts > 1 else 1
    # An MoE layer's experts are `moe_intermediate_size` wide where the config has both.
    widths = ("moe_intermediate_size", "intermediate_size") if experts > 1 else ()
    width = _int(config, *widths, "intermediate_size")
    tied = bool(config.get("tie_word_embeddings", False))

    q_width, kv_width = heads * head_dim, kv_heads * head_dim
    attention = hidden * q_width + 2 * hidden * kv_width + q_width * hidden
    if layout.qkv_bias or layout.attention_bias:
        attention += q_width + 2 * kv_width
    if layout.attention_bias:
        attention += hidden + heads  # the output projection's bias, one sink per head
    if layout.qk_norm:
        attention += 2 * head_dim
    expert = 3 * hidden * width + (2 * width + hidden if layout.expert_bias else 0)
    router = hidden * experts + (experts if layout.expert_bias else 0) if experts > 1 else 0
    norms = 2 * hidden
    per_layer = attention + experts * expert + router + norms
    embeddings = vocab * hidden * (1 if tied else 2)
    total = embeddings + layers * per_layer + hidden
    active = total - layers * (experts - top_k) * expert
    moe = {"active_parameter_count": active} if experts > 1 else {}
    return ModelArchitecture(
        parameter_count=total,
        **moe,
        layers=layers,
        hidden_size=hidden,
        attention_heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=width,
        vocab_size=vocab,
        max_context_length=_int(config, "max_position_embeddings"),
        experts=experts,
        experts_per_token=top_k,
        tied_embeddings=tied,
    )


def _latent_attention_architecture(config: Mapping[str, Any]) -> ModelArchitecture:
    """DeepSeek-V3's layout: multi-head latent attention (queries through a low-rank
    projection, keys and values through a `kv_lora_rank` latent cached with a rotary key of
    `qk_rope_head_dim`), `first_k_dense_replace` dense layers, then in each layer
    `n_routed_experts` routed and `n_shared_experts` shared experts of `moe_intermediate_size`,
    and a router with a bias per expert. The multi-token prediction layers
    (`num_nextn_predict_layers`) are counted apart: engines load them only to speculate."""
    if config.get("moe_layer_freq", 1) != 1:
        raise UnsupportedConfigError(
            "moe_layer_freq other than 1 is not counted; give model.architecture in full"
        )
    hidden = _int(config, "hidden_size")
    layers = _int(config, "num_hidden_layers")
    heads = _int(config, "num_attention_heads")
    nope, rope = _int(config, "qk_nope_head_dim"), _int(config, "qk_rope_head_dim")
    value_dim, latent = _int(config, "v_head_dim"), _int(config, "kv_lora_rank")
    q_rank = config.get("q_lora_rank")
    vocab = _int(config, "vocab_size")
    dense_width = _int(config, "intermediate_size")
    expert_width = _int(config, "moe_intermediate_size")
    routed = _int(config, "n_routed_experts")
    shared = _int(config, "n_shared_experts") if config.get("n_shared_experts") else 0
    top_k = _int(config, "num_experts_per_tok")
    dense_layers = (
        min(layers, _int(config, "first_k_dense_replace"))
        if config.get("first_k_dense_replace")
        else 0
    )
    tied = bool(config.get("tie_word_embeddings", False))

    query_width = heads * (nope + rope)
    if q_rank is None:
        queries = hidden * query_width
    else:
        rank = _int(config, "q_lora_rank")
        queries = hidden * rank + rank + rank * query_width  # down, its norm, up
    keys_values = hidden * (latent + rope) + latent + latent * heads * (nope + value_dim)
    attention = queries + keys_values + heads * value_dim * hidden
    expert = 3 * hidden * expert_width
    router = hidden * routed + (routed if config.get("topk_method") == "noaux_tc" else 0)
    moe_layer = (routed + shared) * expert + router
    norms = 2 * hidden
    sparse_layers = layers - dense_layers
    embeddings = vocab * hidden * (1 if tied else 2)
    total = (
        embeddings
        + layers * (attention + norms)
        + dense_layers * 3 * hidden * dense_width
        + sparse_layers * moe_layer
        + hidden
    )
    active = total - sparse_layers * (routed - top_k) * expert
    return ModelArchitecture(
        parameter_count=total,
        active_parameter_count=active,
        layers=layers,
        hidden_size=hidden,
        attention_heads=heads,
        kv_heads=_int(config, "num_key_value_heads", default=heads),
        head_dim=nope + rope,
        intermediate_size=expert_width,
        vocab_size=vocab,
        max_context_length=_int(config, "max_position_embeddings"),
        experts=routed,
        experts_per_token=top_k,
        tied_embeddings=tied,
        kv_latent_dim=latent + rope,
        prediction_layers=(
            _int(config, "num_nextn_predict_layers")
            if config.get("num_nextn_predict_layers")
            else 0
        ),
    )
