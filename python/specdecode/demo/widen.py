"""Function-preserving *widening* of the trained demo target into a model with the shapes and
the per-token cost of a real 1B-parameter LLM (:func:`widen_model`, :data:`BENCHMARK_1B`).

:func:`specdecode.demo.enlarge_model` adds depth and MLP width; the hidden size stays the
trained 256, so one decode step is a few hundred small matrix-vector products: on a GPU that is
all launch overhead, nothing like a real model. Here the hidden size, the attention heads, the
MLP and the depth all grow, and every new weight is either really computed and multiplied by
exact zeros, or is an exact zero itself:

- **Residual stream.** The trained ``h0`` hidden dimensions come first; the ``h1 - h0`` new ones
  are always exactly 0: the embedding's new columns are 0, and every matrix that writes to the
  residual stream (``o_proj``, ``down_proj``) has zero rows there.
- **RMSNorm.** The mean square over ``h1`` dimensions of a vector whose new dimensions are 0 is
  ``h0 / h1`` times the one over ``h0``; scaling the norm's epsilon by ``h0 / h1`` and its
  trained weights by ``sqrt(h0 / h1)`` gives back exactly the trained normalisation.
- **Attention.** ``head_dim`` is unchanged. Trained query head ``h`` (key/value head ``j``)
  moves to query slot ``j * g1 + h % g0`` (``g`` = query heads per key/value head), so it still
  reads key/value head ``j``, which keeps its trained weights. New heads get random weights and
  their ``o_proj`` columns are 0; every input column beyond ``h0`` is random and multiplies the
  zero dimensions.
- **MLP.** Trained units come first; new units have random gate/up rows and zero ``down_proj``
  columns.
- **Depth.** Trained layer ``i`` sits at ``round(i * L1 / L0)``; the new layers are exact
  pass-throughs (random attention and MLP weights, zero ``o_proj`` and ``down_proj``) that still
  do all their compute and grow the KV cache like real layers.

The logits equal the trained target's up to floating-point rounding (summation order, and the
norm rescaling: about 1e-6 relative in float32). Greedy outputs are the trained target's
wherever it has no near-ties.
"""

from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedModel

#: The 1B-class benchmark target: the shapes of Llama-3.2-1B (hidden 2048, 16 layers, 32 query
#: heads and 8 key/value heads of 64) with the demo's 4096-token vocabulary; the MLP is 8704
#: wide instead of 8192 to make up for the smaller embedding: 1.03B parameters in all.
BENCHMARK_1B: dict[str, int] = {
    "hidden_size": 2048,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 8704,
    "num_hidden_layers": 16,
}


def _layers(model: Any) -> Any:
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or len(layers) == 0:
        raise TypeError("widen_model expects a Llama-style *ForCausalLM (model.model.layers)")
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        if not hasattr(layers[0].self_attn, name):
            raise TypeError(f"attention has no '{name}'")
    for name in ("gate_proj", "up_proj", "down_proj"):
        if not hasattr(layers[0].mlp, name):
            raise TypeError(f"MLP has no '{name}' (expected a gated Llama-style MLP)")
    return layers


def widened_config(config: Any, *, hidden_size: int, num_attention_heads: int, num_key_value_heads: int,
                   intermediate_size: int, num_hidden_layers: int) -> Any:
    """The config of :func:`widen_model`'s result (checks the sizes; allocates nothing)."""
    h0 = int(config.hidden_size)
    heads0 = int(config.num_attention_heads)
    kv0 = int(getattr(config, "num_key_value_heads", None) or heads0)
    head_dim = int(getattr(config, "head_dim", None) or h0 // heads0)
    checks = [
        ("hidden_size", hidden_size, h0),
        ("num_attention_heads", num_attention_heads, heads0),
        ("num_key_value_heads", num_key_value_heads, kv0),
        ("intermediate_size", intermediate_size, int(config.intermediate_size)),
        ("num_hidden_layers", num_hidden_layers, int(config.num_hidden_layers)),
    ]
    for name, value, old in checks:
        if isinstance(value, bool) or not isinstance(value, int) or value < old:
            raise ValueError(f"{name}: expected an int >= the model's {old}, got {value!r}")
    if num_attention_heads % num_key_value_heads:
        raise ValueError(f"num_attention_heads: {num_attention_heads} is not a multiple of num_key_value_heads "
                         f"({num_key_value_heads})")
    if num_attention_heads // num_key_value_heads < heads0 // kv0:
        raise ValueError(f"num_key_value_heads: {num_key_value_heads} gives {num_attention_heads // num_key_value_heads} "
                         f"query heads per key/value head, fewer than the model's {heads0 // kv0}")
    cfg = copy.deepcopy(config)
    cfg.hidden_size = hidden_size
    cfg.num_attention_heads = num_attention_heads
    cfg.num_key_value_heads = num_key_value_heads
    cfg.head_dim = head_dim
    cfg.intermediate_size = intermediate_size
    cfg.num_hidden_layers = num_hidden_layers
    cfg.rms_norm_eps = float(config.rms_norm_eps) * h0 / hidden_size
    if getattr(cfg, "layer_types", None) is not None:
        if len(set(cfg.layer_types)) > 1:
            raise TypeError("models with mixed layer_types are not supported")
        cfg.layer_types = [cfg.layer_types[0]] * num_hidden_layers
    cfg.widened_from = {"hidden_size": h0, "num_attention_heads": heads0, "num_key_value_heads": kv0,
                        "intermediate_size": int(config.intermediate_size),
                        "num_hidden_layers": int(config.num_hidden_layers)}
    return cfg


def count_parameters(config: Any) -> int:
    """Parameters of a causal LM built from ``config``, counted on the meta device (nothing is
    allocated)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def widen_model(model: "PreTrainedModel", *, hidden_size: int, num_attention_heads: int, num_key_value_heads: int,
                intermediate_size: int, num_hidden_layers: int, seed: int = 0,
                device: str | torch.device | None = None, dtype: torch.dtype | None = None) -> "PreTrainedModel":
    """A wider and deeper Llama-style model computing the same function as ``model`` (see the
    module docstring for how). ``model`` is left untouched; the result is built directly on
    ``device`` in ``dtype`` (default: ``model``'s), in eval mode.

    Example:
        >>> from specdecode.demo import load_demo_pair
        >>> from specdecode.demo.widen import widen_model
        >>> target, _, _ = load_demo_pair()
        >>> wide = widen_model(target, hidden_size=512, num_attention_heads=8, num_key_value_heads=4,
        ...                    intermediate_size=1024, num_hidden_layers=8)
        >>> wide.config.hidden_size, wide.config.num_hidden_layers
        (512, 8)
    """
    old_layers = _layers(model)
    old = model.config
    cfg = widened_config(old, hidden_size=hidden_size, num_attention_heads=num_attention_heads,
                         num_key_value_heads=num_key_value_heads, intermediate_size=intermediate_size,
                         num_hidden_layers=num_hidden_layers)
    param = next(model.parameters())
    device = torch.device(device) if device is not None else param.device
    dtype = dtype or param.dtype
    cfg.widened_from["seed"] = seed
    cuda_index = (device.index if device.index is not None else torch.cuda.current_device()) \
        if device.type == "cuda" else None
    with torch.random.fork_rng(devices=[cuda_index] if cuda_index is not None else []):
        torch.manual_seed(seed)
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)  # parameters in dtype; buffers made as float32 (RoPE) stay float32
        try:
            with torch.device(device):
                big = type(model)(cfg)
        finally:
            torch.set_default_dtype(previous)

    h0, h1 = int(old.hidden_size), hidden_size
    d = int(cfg.head_dim)
    heads0 = int(old.num_attention_heads)
    kv0 = int(getattr(old, "num_key_value_heads", None) or heads0)
    g0, g1 = heads0 // kv0, num_attention_heads // num_key_value_heads
    norm_scale = math.sqrt(h0 / h1)

    def put(dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src.to(device=dst.device, dtype=dst.dtype))

    def norm(dst: torch.nn.Module, src: torch.nn.Module) -> None:
        dst.weight.fill_(1.0)
        put(dst.weight[:h0], src.weight.float() * norm_scale)

    emb_old, emb_new = model.get_input_embeddings().weight, big.get_input_embeddings().weight
    emb_new.zero_()
    put(emb_new[:, :h0], emb_old)
    head_old, head_new = model.get_output_embeddings(), big.get_output_embeddings()
    if head_new.weight.data_ptr() != emb_new.data_ptr():
        head_new.weight.zero_()
        put(head_new.weight[:, :h0], head_old.weight)
        if getattr(head_new, "bias", None) is not None:
            put(head_new.bias, head_old.bias)
    norm(big.model.norm, model.model.norm)

    new_layers = big.model.layers
    position = {round(i * num_hidden_layers / len(old_layers)): i for i in range(len(old_layers))}
    for index, layer in enumerate(new_layers):
        attn, mlp = layer.self_attn, layer.mlp
        for linear in (attn.o_proj, mlp.down_proj):  # nothing reaches the residual stream unless copied below
            linear.weight.zero_()
            if getattr(linear, "bias", None) is not None:
                linear.bias.zero_()
        if index not in position:
            continue
        src = old_layers[position[index]]
        norm(layer.input_layernorm, src.input_layernorm)
        norm(layer.post_attention_layernorm, src.post_attention_layernorm)
        for h in range(heads0):
            slot = (h // g0) * g1 + h % g0
            rows_old, rows_new = slice(h * d, (h + 1) * d), slice(slot * d, (slot + 1) * d)
            put(attn.q_proj.weight[rows_new, :h0], src.self_attn.q_proj.weight[rows_old])
            if getattr(attn.q_proj, "bias", None) is not None:
                put(attn.q_proj.bias[rows_new], src.self_attn.q_proj.bias[rows_old])
            put(attn.o_proj.weight[:h0, rows_new], src.self_attn.o_proj.weight[:, rows_old])
        for j in range(kv0):
            rows = slice(j * d, (j + 1) * d)
            for name in ("k_proj", "v_proj"):
                put(getattr(attn, name).weight[rows, :h0], getattr(src.self_attn, name).weight[rows])
                if getattr(getattr(attn, name), "bias", None) is not None:
                    put(getattr(attn, name).bias[rows], getattr(src.self_attn, name).bias[rows])
        if getattr(attn.o_proj, "bias", None) is not None:
            put(attn.o_proj.bias[:h0], src.self_attn.o_proj.bias)
        i0 = int(old.intermediate_size)
        for name in ("gate_proj", "up_proj"):
            put(getattr(mlp, name).weight[:i0, :h0], getattr(src.mlp, name).weight)
            if getattr(getattr(mlp, name), "bias", None) is not None:
                put(getattr(mlp, name).bias[:i0], getattr(src.mlp, name).bias)
        put(mlp.down_proj.weight[:h0, :i0], src.mlp.down_proj.weight)
        if getattr(mlp.down_proj, "bias", None) is not None:
            put(mlp.down_proj.bias[:h0], src.mlp.down_proj.bias)
    if getattr(old, "tie_word_embeddings", False):
        big.tie_weights()
    return big.eval()
