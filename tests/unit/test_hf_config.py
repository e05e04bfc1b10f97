"""Architectures read from Hugging Face config.json files: the catalog's own entries come back
exactly from their published configs (the configs' fields as the model repositories give them),
and configs of other layouts are refused by name."""

from __future__ import annotations

from typing import Any

import pytest

from inferfleet.api.catalog import catalog_models
from inferfleet.api.hf_config import UnsupportedConfigError, architecture_from_hf_config

_LLAMA = {"model_type": "llama", "num_key_value_heads": 8, "vocab_size": 128256}
_DEEPSEEK_V3 = {
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "moe_layer_freq": 1,
    "topk_method": "noaux_tc",
    "vocab_size": 129280,
    "max_position_embeddings": 163840,
    "tie_word_embeddings": False,
    "num_nextn_predict_layers": 1,
}
CONFIGS: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": _LLAMA | {
        "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
        "intermediate_size": 14336, "max_position_embeddings": 131072,
    },
    "llama-3.3-70b": _LLAMA | {
        "hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64,
        "intermediate_size": 28672, "max_position_embeddings": 131072,
    },
    "llama-3.1-405b": _LLAMA | {
        "hidden_size": 16384, "num_hidden_layers": 126, "num_attention_heads": 128,
        "intermediate_size": 53248, "max_position_embeddings": 131072,
    },
    "qwen2.5-7b": {
        "model_type": "qwen2", "hidden_size": 3584, "num_hidden_layers": 28,
        "num_attention_heads": 28, "num_key_value_heads": 4, "intermediate_size": 18944,
        "vocab_size": 152064, "max_position_embeddings": 32768, "tie_word_embeddings": False,
    },
    "qwen2.5-72b": {
        "model_type": "qwen2", "hidden_size": 8192, "num_hidden_layers": 80,
        "num_attention_heads": 64, "num_key_value_heads": 8, "intermediate_size": 29568,
        "vocab_size": 152064, "max_position_embeddings": 32768, "tie_word_embeddings": False,
    },
    "mistral-7b": {
        "model_type": "mistral", "hidden_size": 4096, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "intermediate_size": 14336, "vocab_size": 32768, "max_position_embeddings": 32768,
    },
    "mixtral-8x7b": {
        "model_type": "mixtral", "hidden_size": 4096, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
        "vocab_size": 32000, "max_position_embeddings": 32768, "num_local_experts": 8,
        "num_experts_per_tok": 2,
    },
    "qwen3-30b-a3b": {
        "model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48,
        "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
        "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
        "num_experts_per_tok": 8, "vocab_size": 151936, "max_position_embeddings": 40960,
        "tie_word_embeddings": False, "decoder_sparse_step": 1, "mlp_only_layers": [],
    },
    "gpt-oss-120b": {
        "model_type": "gpt_oss", "hidden_size": 2880, "num_hidden_layers": 36,
        "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
        "intermediate_size": 2880, "num_local_experts": 128, "num_experts_per_tok": 4,
        "vocab_size": 201088, "max_position_embeddings": 131072, "tie_word_embeddings": False,
    },
    "gpt-oss-20b": {
        "model_type": "gpt_oss", "hidden_size": 2880, "num_hidden_layers": 24,
        "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
        "intermediate_size": 2880, "num_local_experts": 32, "num_experts_per_tok": 4,
        "vocab_size": 201088, "max_position_embeddings": 131072, "tie_word_embeddings": False,
    },
    "qwen3-8b": {
        "model_type": "qwen3", "hidden_size": 4096, "num_hidden_layers": 36,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "intermediate_size": 12288, "vocab_size": 151936, "max_position_embeddings": 40960,
        "tie_word_embeddings": False,
    },
    "qwen3-32b": {
        "model_type": "qwen3", "hidden_size": 5120, "num_hidden_layers": 64,
        "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
        "intermediate_size": 25600, "vocab_size": 151936, "max_position_embeddings": 40960,
        "tie_word_embeddings": False,
    },
    "deepseek-v3": _DEEPSEEK_V3,
    "deepseek-r1": _DEEPSEEK_V3,
}  # fmt: skip


def test_every_catalog_entry_has_its_config_here() -> None:
    assert sorted(CONFIGS) == sorted(catalog_models())


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_catalog_entry_comes_back_from_its_config(name: str) -> None:
    read = architecture_from_hf_config(CONFIGS[name])
    assert read.to_wire() == catalog_models()[name].to_wire()


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"model_type": "deepseek_v2"}, "deepseek_v2"),
        (_DEEPSEEK_V3 | {"moe_layer_freq": 2}, "moe_layer_freq"),
        ({k: v for k, v in _DEEPSEEK_V3.items() if k != "kv_lora_rank"}, "kv_lora_rank"),
        (CONFIGS["llama-3.1-8b"] | {"hidden_size": "4096"}, "hidden_size"),
        (CONFIGS["llama-3.1-8b"] | {"num_attention_heads": 0}, "num_attention_heads"),
        ({k: v for k, v in CONFIGS["llama-3.1-8b"].items() if k != "vocab_size"}, "vocab_size"),
        (CONFIGS["qwen3-30b-a3b"] | {"mlp_only_layers": [0, 1]}, "mlp_only_layers"),
    ],
)
def test_configs_it_cannot_count_are_refused_by_name(config: dict[str, Any], says: str) -> None:
    with pytest.raises(UnsupportedConfigError, match=says):
        architecture_from_hf_config(config)


def test_latent_attention_counts_match_the_published_totals() -> None:
    """DeepSeek-V3's model card: 671B parameters, 36.6B activated per token without the input
    embedding (a lookup, not a matmul)."""
    read = architecture_from_hf_config(_DEEPSEEK_V3)
    embedding = read.vocab_size * read.hidden_size
    assert round(read.parameter_count / 1e9) == 671
    assert round((read.active_parameters - embedding) / 1e8) == 366
    assert read.kv_latent_dim == 512 + 64
