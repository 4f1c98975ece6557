"""The DFlash network: a small non-causal block drafter reading the target's hidden states.

DFlash (Chen et al., 2026) drafts a whole block in one forward. Write ``x_p`` for a row's pending
token (the last one the target emitted, not yet in any cache) at position ``p``. The *block* is
``x_p`` followed by ``block_size - 1`` mask tokens at positions ``p .. p + block_size - 1``; the
network's output at block position ``j >= 1`` is the distribution of ``x_{p + j}``, through the
target's own (frozen) LM head. So one forward gives every draft position's distribution, and
none of them depends on the tokens drafted before it.

The target's context enters as keys and values only. Its hidden states at ``target_layer_ids``
(the outputs of those decoder layers, 0-based, DFlash's convention; in Hugging Face's
``hidden_states`` they sit at ``id + 1``) are concatenated per committed column, fused by a linear
layer ``fc`` and an RMSNorm ``hidden_norm`` into one vector ``c_t`` per column, and every draft
layer projects ``c_t`` with its own key and value projections (key norm and rotary embedding at
the column's position included). A block query attends to the context columns before ``p`` and
to every block position (both directions); nothing attends to the block from outside. The
context's keys and values depend on ``c_t`` alone, never on an earlier layer's output, so each
committed column is projected once and cached: a step costs the new columns' projections plus
``num_layers`` decoder layers over ``block_size`` queries.

Each draft layer is a pre-norm decoder layer (RMSNorm, attention with optional per-head query and
key RMSNorms, RMSNorm, gated SiLU MLP), with the parameter names of the published checkpoints
(``layers.N.self_attn.q_proj`` ..., ``fc``, ``hidden_norm``, ``norm``), so one loads as it is
(:mod:`specdecode.drafters.dflash_checkpoint`). The mask token is a target token id
(``mask_token_id``, whose embedding the target owns) or, when None, a trained vector
``mask_embedding``. ``draft_vocab`` restricts the drafted ids to a subset (a reduced head, the
target head's rows for those ids: :mod:`specdecode.models.reduced_head`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specdecode.drafters.last_feature import check_count
from specdecode.models import decoder_layers, vocab_rows

__all__ = ["DFlashConfig", "DFlashModel", "block_mask", "block_positions", "check_target_layer_ids",
           "default_target_layer_ids", "rope_base", "rotary"]


def default_target_layer_ids(num_target_layers: int, count: int) -> tuple[int, ...]:
    """``count`` target layers spread evenly from the second to the fourth from last (DFlash's
    choice: early, middle and late features), fewer on a shallow target (distinct ids only).

    >>> default_target_layer_ids(36, 5)
    (1, 9, 17, 25, 33)
    >>> default_target_layer_ids(6, 2)
    (1, 3)
    """
    if count < 1 or num_target_layers < 1:
        raise ValueError(f"num_feature_layers: expected an int >= 1, got {count!r}")
    low, high = min(1, num_target_layers - 1), max(min(1, num_target_layers - 1), num_target_layers - 3)
    if count == 1:
        return ((low + high) // 2,)
    ids = sorted({int(round(low + i * (high - low) / (count - 1))) for i in range(count)})
    return tuple(ids)


@dataclass(frozen=True)
class DFlashConfig:
    """The shape of a DFlash network. ``hidden_size`` must be the target's (the block is embedded
    and read out by the target); ``target_layer_ids`` are 0-based decoder layers of the target.
    ``rope_theta``: the rotary base (default rotary embedding only)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    block_size: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    attention_bias: bool = False
    qk_norm: bool = True

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["target_layer_ids"] = list(self.target_layer_ids)
        return out

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "DFlashConfig":
        known = {k: v for k, v in values.items() if k in cls.__dataclass_fields__}
        known["target_layer_ids"] = tuple(known.get("target_layer_ids", ()))
        return cls(**known)

    @classmethod
    def for_target(cls, target: nn.Module, *, num_layers: int = 1, block_size: int = 16,
                   target_layer_ids: tuple[int, ...] | None = None, num_feature_layers: int | None = None,
                   mask_token_id: int | None = None) -> "DFlashConfig":
        """A network shaped like ``target``'s decoder layers (heads, head size, MLP width, rotary
        base), ``num_layers`` deep, reading ``target_layer_ids`` (default: ``num_feature_layers``
        of them spread by :func:`default_target_layer_ids`, as many as ``num_layers`` unless
        given). ``ValueError`` naming the argument for a bad value."""
        config = getattr(target, "config", None)
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        hidden = int(target.get_input_embeddings().weight.shape[1])
        heads = int(getattr(text, "num_attention_heads", max(1, hidden // 64)))
        head_dim = int(getattr(text, "head_dim", None) or hidden // heads)
        kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
        ffn = int(getattr(text, "intermediate_size", None) or 4 * hidden)
        total = len(decoder_layers(target))
        check_count("num_layers", num_layers)
        check_block_size(block_size)
        if target_layer_ids is None:
            count = num_layers if num_feature_layers is None else check_count("num_feature_layers", num_feature_layers)
            target_layer_ids = default_target_layer_ids(total, min(count, total))
        return cls(hidden_size=hidden, num_layers=num_layers, num_heads=heads, num_kv_heads=kv_heads,
                   head_dim=head_dim, intermediate_size=ffn, block_size=block_size,
                   target_layer_ids=check_target_layer_ids(target_layer_ids, total), mask_token_id=mask_token_id,
                   rms_norm_eps=float(getattr(text, "rms_norm_eps", 1e-6) or 1e-6), rope_theta=rope_base(text))


def check_block_size(value: Any, name: str = "block_size") -> int:
    """``value``, or ``ValueError`` naming ``name`` unless it is an int >= 2 (the pending token
    and at least one draft)."""
    if check_count(name, value) < 2:
        raise ValueError(f"{name}: expected an int >= 2, got {value!r}")
    return value


def check_target_layer_ids(ids: Any, num_target_layers: int) -> tuple[int, ...]:
    """``ids`` as a tuple of distinct decoder-layer indices in ``[0, num_target_layers)``, or
    ``ValueError`` naming ``target_layer_ids``."""
    if (isinstance(ids, (str, bytes)) or not isinstance(ids, (list, tuple)) or not ids
            or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)):
        raise ValueError(f"target_layer_ids: expected a non-empty list of decoder-layer indices, got {ids!r}")
    if any(not 0 <= i < num_target_layers for i in ids) or len(set(ids)) != len(ids):
        raise ValueError(f"target_layer_ids: expected distinct indices in [0, {num_target_layers}) for a target with "
                         f"{num_target_layers} decoder layers, got {list(ids)}")
    return tuple(ids)


def rope_base(config: Any) -> float:
    """The rotary base of a Hugging Face config (``rope_theta`` or ``rope_parameters``), or
    ``ValueError`` naming ``rope_scaling`` for a scaled rotary embedding (not supported here)."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if isinstance(params, dict) and params.get("rope_type", params.get("type", "default")) not in ("default", None):
        raise ValueError(f"rope_scaling: DFlash drafters use the default rotary embedding, got {params!r}")
    theta = params.get("rope_theta") if isinstance(params, dict) else None
    return float(theta or getattr(config, "rope_theta", None) or 10000.0)


def inverse_frequencies(head_dim: int, theta: float, device: torch.device | None = None) -> Tensor:
    """The rotary embedding's inverse frequencies ``[head_dim / 2]`` float32 (base ``theta``)."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))


def rotary(positions: Tensor, inv_freq: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Cosines and sines of the rotary embedding at ``positions`` (halves repeated, the
    ``rotate_half`` layout). Shape: positions ``[b, n]``; inv_freq ``[head_dim / 2]``
    (:func:`inverse_frequencies`); returns two ``[b, 1, n, head_dim]``."""
    angles = positions.float()[..., None] * inv_freq
    angles = torch.cat([angles, angles], -1)[:, None]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + turned * sin


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned scale (computed in float32)."""

    def __init__(self, size: int, eps: float, **factory: Any) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, **factory))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


class DFlashAttention(nn.Module):
    """Block queries over the context's cached keys/values and the block's own."""

    def __init__(self, c: DFlashConfig, **factory: Any) -> None:
        super().__init__()
        self.c = c
        bias = c.attention_bias
        self.q_proj = nn.Linear(c.hidden_size, c.num_heads * c.head_dim, bias=bias, **factory)
        self.k_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=bias, **factory)
        self.v_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=bias, **factory)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=bias, **factory)
        if c.qk_norm:
            self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps, **factory)
            self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps, **factory)

    def _heads(self, x: Tensor, proj: nn.Linear, count: int, norm: str | None) -> Tensor:
        b, n, _ = x.shape
        y = proj(x).view(b, n, count, self.c.head_dim)
        if norm is not None and self.c.qk_norm:
            y = getattr(self, norm)(y)
        return y.transpose(1, 2)

    def keys_values(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """Rotated keys and values of ``x``. Shape: ``[b, n, H]`` -> two ``[b, kv_heads, n, head_dim]``."""
        keys = _rotate(self._heads(x, self.k_proj, self.c.num_kv_heads, "k_norm"), cos, sin)
        return keys, self._heads(x, self.v_proj, self.c.num_kv_heads, None)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, context_keys: Tensor, context_values: Tensor,
                mask: Tensor) -> Tensor:
        """Shape: x ``[b, n, H]``; context keys/values ``[b, kv_heads, C, head_dim]``; mask
        ``[b, 1, n, C + n]`` bool (True: attend). Returns ``[b, n, H]``.

        The context's keys and values are read where they are (never concatenated with the
        block's, never repeated per query head): the scores over the context and over the block
        share one softmax, each query head reads its key/value head through a grouped view.
        """
        b, n, _ = x.shape
        c = self.c
        groups = c.num_heads // c.num_kv_heads
        queries = _rotate(self._heads(x, self.q_proj, c.num_heads, "q_norm"), cos, sin)
        queries = queries.reshape(b, c.num_kv_heads, groups * n, c.head_dim)  # heads of one group together
        keys, values = self.keys_values(x, cos, sin)
        scale = c.head_dim ** -0.5
        context = context_keys.shape[2]
        scores = torch.cat([queries @ context_keys.to(queries.dtype).transpose(-1, -2),
                            queries @ keys.transpose(-1, -2)], -1) * scale  # [b, kvh, g * n, C + n]
        allowed = mask[:, :, None].expand(b, 1, groups, n, context + n).reshape(b, 1, groups * n, context + n)
        weights = scores.float().masked_fill(~allowed, float("-inf")).softmax(-1).to(queries.dtype)
        out = weights[..., :context] @ context_values.to(queries.dtype) + weights[..., context:] @ values
        out = out.view(b, c.num_heads, n, c.head_dim).transpose(1, 2).reshape(b, n, -1)
        return self.o_proj(out)


class GatedMLP(nn.Module):
    def __init__(self, c: DFlashConfig, **factory: Any) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False, **factory)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False, **factory)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False, **factory)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DFlashLayer(nn.Module):
    def __init__(self, c: DFlashConfig, **factory: Any) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, **factory)
        self.self_attn = DFlashAttention(c, **factory)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, **factory)
        self.mlp = GatedMLP(c, **factory)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, keys: Tensor, values: Tensor, mask: Tensor) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, keys, values, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashModel(nn.Module):
    """The trainable DFlash network for ``target`` (only read: its embedding and LM head are used
    frozen, never stored here). ``draft_vocab``: None (every id) or ``[Vd]`` distinct target ids
    the drafter may propose (the ``draft_to_target`` buffer).

    Parameters: ``fc [H, len(target_layer_ids) * H]``, ``hidden_norm``, ``layers`` (see
    :class:`DFlashLayer`), ``norm``; ``mask_embedding [H]`` when the config has no mask token.
    """

    def __init__(self, target: nn.Module, config: DFlashConfig, draft_vocab: Tensor | None = None) -> None:
        super().__init__()
        if not isinstance(config, DFlashConfig):
            raise TypeError(f"config: expected a DFlashConfig, got {type(config).__name__}")
        hidden = int(target.get_input_embeddings().weight.shape[1])
        if config.hidden_size != hidden:
            raise ValueError(f"config: hidden_size {config.hidden_size} is not the target's ({hidden})")
        if config.num_heads % config.num_kv_heads or config.head_dim % 2:
            raise ValueError(f"config: num_heads ({config.num_heads}) must be a multiple of num_kv_heads "
                             f"({config.num_kv_heads}) and head_dim ({config.head_dim}) even")
        check_block_size(config.block_size)
        check_target_layer_ids(list(config.target_layer_ids), len(decoder_layers(target)))
        self.target_vocab = vocab_rows(target)
        if config.mask_token_id is not None and not 0 <= config.mask_token_id < target.get_input_embeddings().weight.shape[0]:
            raise ValueError(f"mask_token_id: {config.mask_token_id} is not a row of the target's embedding")
        self.config = config
        reference = next(target.parameters())
        factory = {"dtype": reference.dtype, "device": reference.device}
        self.fc = nn.Linear(len(config.target_layer_ids) * hidden, hidden, bias=False, **factory)
        self.hidden_norm = RMSNorm(hidden, config.rms_norm_eps, **factory)
        self.layers = nn.ModuleList(DFlashLayer(config, **factory) for _ in range(config.num_layers))
        self.norm = RMSNorm(hidden, config.rms_norm_eps, **factory)
        # computed once (not saved: the config has the rotary base)
        self.register_buffer("inv_freq", inverse_frequencies(config.head_dim, config.rope_theta, reference.device),
                             persistent=False)
        if config.mask_token_id is None:
            scale = float(target.get_input_embeddings().weight.detach().float().std())
            generator = torch.Generator().manual_seed(0)
            start = torch.randn(hidden, generator=generator) * scale
            self.mask_embedding = nn.Parameter(start.to(**factory))
        else:
            self.mask_embedding = None
        ids = None
        if draft_vocab is not None:
            if not isinstance(draft_vocab, Tensor) or draft_vocab.dim() != 1 or draft_vocab.numel() == 0:
                raise ValueError("draft_vocab: expected a non-empty 1-D tensor of target token ids")
            ids = draft_vocab.to(device=reference.device, dtype=torch.long)
            if int(ids.min()) < 0 or int(ids.max()) >= self.target_vocab or ids.unique().numel() != ids.numel():
                raise ValueError(f"draft_vocab: expected distinct token ids in [0, {self.target_vocab})")
        self.register_buffer("draft_to_target", ids)

    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """The target's ``hidden_states`` indices the network reads (``target_layer_ids + 1``)."""
        return tuple(i + 1 for i in self.config.target_layer_ids)

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    @property
    def draft_vocab_size(self) -> int | None:
        return None if self.draft_to_target is None else int(self.draft_to_target.numel())

    def _inverse_frequencies(self) -> Tensor:
        """The kept inverse frequencies, recomputed in float32 if a cast of the module lowered them."""
        if self.inv_freq.dtype == torch.float32:
            return self.inv_freq
        return inverse_frequencies(self.config.head_dim, self.config.rope_theta, self.inv_freq.device)

    def context_keys_values(self, features: Tensor, positions: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Every layer's keys and values of context columns from the target's features.

        Shape:
            features: ``[b, n, len(target_layer_ids) * H]``; positions: ``[b, n]``.
            Returns per layer two ``[b, kv_heads, n, head_dim]``.
        """
        context = self.hidden_norm(self.fc(features.to(self.dtype)))
        cos, sin = rotary(positions, self._inverse_frequencies(), self.dtype)
        return [layer.self_attn.keys_values(context, cos, sin) for layer in self.layers]

    def block_embeddings(self, target: nn.Module, tokens: Tensor, is_mask: Tensor) -> Tensor:
        """The block's input: the target's embedding of ``tokens``, the mask token's at
        ``is_mask``. Shape: tokens, is_mask ``[b, n]``; returns ``[b, n, H]``."""
        embed = target.get_input_embeddings()
        if self.mask_embedding is None:
            tokens = torch.where(is_mask, torch.full_like(tokens, self.config.mask_token_id), tokens)
            return embed(tokens).to(self.dtype)
        x = embed(tokens.masked_fill(is_mask, 0)).to(self.dtype)
        return torch.where(is_mask[..., None], self.mask_embedding.to(x.dtype), x)

    def forward(self, embeds: Tensor, positions: Tensor, context: list[tuple[Tensor, Tensor]], mask: Tensor) -> Tensor:
        """The normed outputs of the block queries.

        Shape:
            embeds: ``[b, n, H]``; positions: ``[b, n]``; context: per layer keys/values
            ``[b, kv_heads, C, head_dim]``; mask: ``[b, 1, n, C + n]`` bool (True: attend).
            Returns ``[b, n, H]``.
        """
        cos, sin = rotary(positions, self._inverse_frequencies(), self.dtype)
        x = embeds
        for layer, (keys, values) in zip(self.layers, context):
            x = layer(x, cos, sin, keys, values, mask)
        return self.norm(x)


def block_mask(context_visible: Tensor, block_size: int) -> Tensor:
    """The attention mask of one block per row: the visible context columns, then the whole
    block. Shape: context_visible ``[b, C]`` bool; returns ``[b, 1, block_size, C + block_size]``."""
    b = context_visible.shape[0]
    block = context_visible.new_ones((b, block_size))
    return torch.cat([context_visible, block], 1)[:, None, None, :].expand(b, 1, block_size, -1)


def block_positions(first: Tensor, block_size: int) -> Tensor:
    """Positions of blocks starting at ``first``. Shape: ``[b]`` -> ``[b, block_size]``."""
    return first[:, None] + torch.arange(block_size, device=first.device)

