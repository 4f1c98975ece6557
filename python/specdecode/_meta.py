"""Fake (meta) implementations of every op, so torch.compile and FakeTensor tracing know the
output shapes without running a kernel."""

from __future__ import annotations

from typing import Sequence

import torch

from specdecode import _ops  # noqa: F401  (the schemas must exist first)
from torch import Tensor


def _check_given(tensors: dict[str, object], optional: tuple[str, ...] = ()) -> None:
    """A required Tensor argument passed as None (the compiled ops raise TypeError too)."""
    for name, tensor in tensors.items():
        if name not in optional:
            torch._check_type(isinstance(tensor, Tensor), lambda name=name: f"{name}: expected a Tensor, got None")


def _verify_outputs(target_name: str, target: Tensor, others: dict[str, Tensor | None],
                    draft_tokens: Tensor) -> tuple[Tensor, Tensor]:
    # The same checks as the compiled ops, so a mixed-device call that lands here (a meta
    # tensor among CPU ones) raises instead of returning uninitialised tensors.
    _check_given({target_name: target, **others}, optional=("draft_probs", "draft_logits"))
    for name, tensor in others.items():
        if tensor is not None:
            torch._check_value(
                tensor.device == target.device,
                lambda name=name, tensor=tensor: f"{name}: expected device {target.device}, got {tensor.device}",
            )
    torch._check_value(draft_tokens.dim() == 2, lambda: "draft_tokens: expected shape [B, gamma]")
    B, gamma = draft_tokens.shape
    torch._check_value(
        target.dim() == 3 and target.shape[0] == B and target.shape[1] == gamma + 1,
        lambda: f"{target_name}: expected shape [B, gamma+1, V] = [{B}, {gamma + 1}, V], got {tuple(target.shape)}",
    )
    return draft_tokens.new_empty((B, gamma + 1)), draft_tokens.new_empty((B,))


@torch.library.register_fake("specdecode::verify_probs")
def _verify_probs_fake(
    target_probs: Tensor,
    draft_probs: Tensor | None,
    draft_tokens: Tensor,
    num_draft_tokens: Tensor,
    uniforms: Tensor,
    rule: str,
    rule_params: Sequence[float],
) -> tuple[Tensor, Tensor]:
    others = {"draft_probs": draft_probs, "draft_tokens": draft_tokens, "num_draft_tokens": num_draft_tokens,
              "uniforms": uniforms}
    return _verify_outputs("target_probs", target_probs, others, draft_tokens)


@torch.library.register_fake("specdecode::verify_logits")
def _verify_logits_fake(
    target_logits: Tensor,
    draft_logits: Tensor | None,
    draft_tokens: Tensor,
    num_draft_tokens: Tensor,
    uniforms: Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float,
    rule: str,
    rule_params: Sequence[float],
) -> tuple[Tensor, Tensor]:
    others = {"draft_logits": draft_logits, "draft_tokens": draft_tokens, "num_draft_tokens": num_draft_tokens,
              "uniforms": uniforms}
    return _verify_outputs("target_logits", target_logits, others, draft_tokens)


@torch.library.register_fake("specdecode::verify_probs_philox")
def _verify_probs_philox_fake(
    target_probs: Tensor,
    draft_probs: Tensor | None,
    draft_tokens: Tensor,
    num_draft_tokens: Tensor,
    philox_seed: Tensor,
    philox_offset: Tensor,
    rule: str,
    rule_params: Sequence[float],
) -> tuple[Tensor, Tensor]:
    others = {"draft_probs": draft_probs, "draft_tokens": draft_tokens, "num_draft_tokens": num_draft_tokens,
              "philox_seed": philox_seed, "philox_offset": philox_offset}
    return _verify_outputs("target_probs", target_probs, others, draft_tokens)


@torch.library.register_fake("specdecode::verify_logits_philox")
def _verify_logits_philox_fake(
    target_logits: Tensor,
    draft_logits: Tensor | None,
    draft_tokens: Tensor,
    num_draft_tokens: Tensor,
    philox_seed: Tensor,
    philox_offset: Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float,
    rule: str,
    rule_params: Sequence[float],
) -> tuple[Tensor, Tensor]:
    others = {"draft_logits": draft_logits, "draft_tokens": draft_tokens, "num_draft_tokens": num_draft_tokens,
              "philox_seed": philox_seed, "philox_offset": philox_offset}
    return _verify_outputs("target_logits", target_logits, others, draft_tokens)


def _sample_outputs(logits: Tensor, others: dict[str, Tensor]) -> Tensor:
    _check_given({"logits": logits, **others})
    for name, tensor in others.items():
        torch._check_value(
            tensor.device == logits.device,
            lambda name=name, tensor=tensor: f"{name}: expected device {logits.device}, got {tensor.device}",
        )
    torch._check_value(logits.dim() == 2, lambda: f"logits: expected shape [B, V], got {tuple(logits.shape)}")
    return logits.new_empty((logits.shape[0],), dtype=torch.int64)


@torch.library.register_fake("specdecode::sample_logits")
def _sample_logits_fake(logits: Tensor, uniforms: Tensor, temperature: float, top_k: int, top_p: float,
                        min_p: float) -> Tensor:
    return _sample_outputs(logits, {"uniforms": uniforms})


@torch.library.register_fake("specdecode::sample_logits_philox")
def _sample_logits_philox_fake(logits: Tensor, philox_seed: Tensor, philox_offset: Tensor, temperature: float,
                               top_k: int, top_p: float, min_p: float) -> Tensor:
    return _sample_outputs(logits, {"philox_seed": philox_seed, "philox_offset": philox_offset})


@torch.library.register_fake("specdecode::processed_probs")
def _processed_probs_fake(logits: Tensor, temperature: float, top_k: int, top_p: float, min_p: float) -> Tensor:
    torch._check_value(logits.dim() == 2, lambda: f"logits: expected shape [B, V], got {tuple(logits.shape)}")
    return logits.new_empty(logits.shape, dtype=torch.float64)
# ---------------------------------------------------------------------------- token trees


def _check_same_device(reference_name: str, reference: Tensor, others: dict[str, Tensor | None]) -> None:
    for name, tensor in others.items():
        if tensor is not None:
            torch._check_value(
                tensor.device == reference.device,
                lambda name=name, tensor=tensor: f"{name}: expected device {reference.device} (that of "
                f"{reference_name}), got {tensor.device}",
            )


@torch.library.register_fake("specdecode::tree_attention_mask")
def _tree_attention_mask_fake(parents: Tensor, num_nodes: Tensor, prefix_mask: Tensor,
                              root_positions: Tensor) -> tuple[Tensor, ...]:
    _check_same_device("parents", parents, {"num_nodes": num_nodes, "prefix_mask": prefix_mask,
                                            "root_positions": root_positions})
    torch._check_value(parents.dim() == 2, lambda: f"parents: expected shape [B, N], got {tuple(parents.shape)}")
    torch._check_value(prefix_mask.dim() == 2, lambda: f"prefix_mask: expected shape [B, W], got {tuple(prefix_mask.shape)}")
    B, N = parents.shape
    W = prefix_mask.shape[1]
    words = (N + 31) // 32
    return (
        parents.new_empty((B, N)),
        parents.new_empty((B, 1, N, W + N), dtype=torch.bool),
        parents.new_empty((B, N, N), dtype=torch.bool),
        parents.new_empty((B, N, words), dtype=torch.int32),
        parents.new_empty((B, N)),
        parents.new_empty((B, N)),
        parents.new_empty((B, N)),
    )


def _verify_tree_outputs(target_logits: Tensor, parents: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    torch._check_value(parents.dim() == 2, lambda: f"parents: expected shape [B, N], got {tuple(parents.shape)}")
    B, N = parents.shape
    torch._check_value(
        target_logits.dim() == 3 and target_logits.shape[0] == B and target_logits.shape[1] == N,
        lambda: f"target_logits: expected shape [B, N, V] = [{B}, {N}, V], got {tuple(target_logits.shape)}",
    )
    return parents.new_empty((B, N)), parents.new_empty((B,)), parents.new_empty((B, N))


@torch.library.register_fake("specdecode::verify_tree")
def _verify_tree_fake(
    target_logits: Tensor,
    draft_logits: Tensor | None,
    tree_tokens: Tensor,
    parents: Tensor,
    num_nodes: Tensor,
    uniforms: Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float,
    rule: str,
    rule_params: Sequence[float],
) -> tuple[Tensor, Tensor, Tensor]:
    _check_same_device("target_logits", target_logits, {"draft_logits": draft_logits, "tree_tokens": tree_tokens,
                                                        "parents": parents, "num_nodes": num_nodes,
                                                        "uniforms": uniforms})
    return _verify_tree_outputs(target_logits, parents)


@torch.library.register_fake("specdecode::verify_tree_philox")
def _verify_tree_philox_fake(
    target_logits: Tensor,
    draft_logits: Tensor | None,
    tree_tokens: Tensor,
    parents: Tensor,
    num_nodes: Tensor,
    philox_seed: Tensor,
    philox_offset: Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float,
    rule: str,
    rule_params: Sequence[float],
) -> tuple[Tensor, Tensor, Tensor]:
    _check_same_device("target_logits", target_logits, {"draft_logits": draft_logits, "tree_tokens": tree_tokens,
                                                        "parents": parents, "num_nodes": num_nodes,
                                                        "philox_seed": philox_seed, "philox_offset": philox_offset})
    return _verify_tree_outputs(target_logits, parents)


# ------------------------------------------------------------------------- CPU fast path


@torch.library.register_fake("specdecode::skinny_linear")
def _skinny_linear_fake(input: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """Shape: input [..., K], weight [N, K], bias [N] or None -> [..., N] float32."""
    _check_given({"input": input, "weight": weight})
    _check_same_device("input", input, {"weight": weight, "bias": bias})
    torch._check_type(input.dtype == torch.float32, lambda: f"input: expected dtype float32, got {input.dtype}")
    torch._check_type(weight.dtype in (torch.float32, torch.bfloat16),
                      lambda: f"weight: expected dtype float32 or bfloat16, got {weight.dtype}")
    torch._check_value(input.dim() >= 1, lambda: "input: expected shape [..., K], got a 0-dimensional tensor")
    torch._check_value(weight.dim() == 2 and weight.shape[1] == input.shape[-1],
                       lambda: f"weight: expected shape [N, K] with K = {input.shape[-1]}, got {tuple(weight.shape)}")
    if bias is not None:
        torch._check_type(bias.dtype == torch.float32, lambda: f"bias: expected dtype float32, got {bias.dtype}")
        torch._check_value(bias.dim() == 1 and bias.shape[0] == weight.shape[0],
                           lambda: f"bias: expected shape [N] = [{weight.shape[0]}], got {tuple(bias.shape)}")
    return input.new_empty((*input.shape[:-1], weight.shape[0]))


@torch.library.register_fake("specdecode::skinny_attention")
def _skinny_attention_fake(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor, scale: float) -> Tensor:
    """Shape: query [B, H, n, D], key and value [B, Hkv, C, D], attn_mask [B or 1, H or 1, n or 1, C]
    (float32 additive or bool) -> [B, H, n, D] float32."""
    _check_given({"query": query, "key": key, "value": value, "attn_mask": attn_mask})
    _check_same_device("query", query, {"key": key, "value": value, "attn_mask": attn_mask})
    for name, tensor in (("query", query), ("key", key), ("value", value), ("attn_mask", attn_mask)):
        allowed = (torch.float32, torch.bool) if name == "attn_mask" else (torch.float32,)
        torch._check_type(tensor.dtype in allowed, lambda name=name, tensor=tensor, allowed=allowed: (
            f"{name}: expected dtype {' or '.join(str(d).removeprefix('torch.') for d in allowed)}, "
            f"got {tensor.dtype}"))
        torch._check_value(tensor.dim() == 4, lambda name=name, tensor=tensor: (
            f"{name}: expected 4 dimensions, got {tensor.dim()} dimensions {tuple(tensor.shape)}"))
    B, H, n, D = query.shape
    torch._check_value(key.shape[0] == B and key.shape[3] == D and value.shape == key.shape, lambda: (
        f"key, value: expected shape [B, Hkv, C, D] with B = {B} and D = {D}, got {tuple(key.shape)}, "
        f"{tuple(value.shape)}"))
    Hkv, C = key.shape[1], key.shape[2]
    torch._check_value(H % Hkv == 0 if Hkv > 0 else H == 0,
                       lambda: f"key: expected a number of heads Hkv that divides query's H = {H}, got Hkv = {Hkv}")
    mb, mh, mn, mc = attn_mask.shape
    torch._check_value(mb in (1, B) and mh in (1, H) and mn in (1, n) and mc == C, lambda: (
        f"attn_mask: expected shape [B or 1, H or 1, n or 1, C] = [{B}, {H}, {n}, {C}], got {tuple(attn_mask.shape)}"))
    return query.new_empty((B, H, n, D))
