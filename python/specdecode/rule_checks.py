"""Checks of what a user-written verification rule returns, chain or tree.

A rule registered with :func:`specdecode.register_rule` or
:func:`specdecode.trees.register_tree_rule` runs in plain PyTorch, so nothing compiled stands
between a mistake in it and the generated text. Every output is checked here before anyone reads
it: the container, each tensor's type, dtype and shape, the accepted length's range,
the accepted tokens (they must be the drafted ones: the target scored nothing else) and the
emitted token's range. Each error names the rule and the field.

>>> import torch
>>> draft = torch.tensor([[4, 5]])
>>> check_chain_output((torch.tensor([[4, 9, -1]]), torch.tensor([1])), "mine", draft, torch.tensor([2]), 10)
VerifyOutput(tokens=tensor([[ 4,  9, -1]]), accepted_len=tensor([1]))
>>> check_chain_output((torch.tensor([[7, 9, -1]]), torch.tensor([1])), "mine", draft, torch.tensor([2]), 10)
Traceback (most recent call last):
    ...
ValueError: rule 'mine' returned tokens[0, 0] = 7 at an accepted position, but the draft there is 4 (accepted positions must hold the drafted tokens)
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from specdecode.reference import VerifyOutput


def _unpack(result: Any, rule: str, kind: str, names: tuple[str, ...]) -> tuple[Any, ...]:
    what = ", ".join(names)
    if isinstance(result, (tuple, list)):
        if len(result) != len(names):
            raise TypeError(f"{kind} {rule!r} returned a {type(result).__name__} of {len(result)} items; expected "
                            f"{len(names)}: ({what})")
        return tuple(result)
    raise TypeError(f"{kind} {rule!r} returned {type(result).__name__}; expected a {len(names)}-tuple ({what})")


def _check_field(kind: str, rule: str, name: str, value: Any, shape: tuple[int, ...], shape_text: str,
                 device: torch.device) -> Tensor:
    """``value`` checked for type, dtype and shape, on ``device``."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{kind} {rule!r} returned {name} of type {type(value).__name__}; expected an int64 tensor "
                        f"of shape {shape_text}")
    if value.dtype != torch.int64:
        raise TypeError(f"{kind} {rule!r} returned {name} of dtype {value.dtype}; expected torch.int64")
    if tuple(value.shape) != shape:
        raise ValueError(f"{kind} {rule!r} returned {name} of shape {tuple(value.shape)}; expected {shape_text} = "
                         f"{list(shape)}")
    return value.to(device)  # a rule may build its outputs on the CPU


def _first(bad: Tensor) -> tuple[int, ...]:
    return tuple(int(v) for v in torch.nonzero(bad)[0])


def _check_emitted(kind: str, rule: str, tokens: Tensor, accepted_len: Tensor, vocab_size: int) -> None:
    """The token after the accepted ones lies in [0, V); every later one is -1 padding."""
    B, width = tokens.shape
    emitted = tokens.gather(1, accepted_len[:, None])[:, 0]
    bad = (emitted < 0) | (emitted >= vocab_size)
    if bool(bad.any()):
        b = _first(bad)[0]
        raise ValueError(f"{kind} {rule!r} returned tokens[{b}, {int(accepted_len[b])}] = {int(emitted[b])}, the "
                         f"emitted token, outside [0, V) = [0, {vocab_size})")
    after = torch.arange(width, device=tokens.device)[None, :] > accepted_len[:, None]
    bad = after & (tokens != -1)
    if bool(bad.any()):
        b, i = _first(bad)
        raise ValueError(f"{kind} {rule!r} returned tokens[{b}, {i}] = {int(tokens[b, i])} after the emitted token; "
                         "expected -1 padding there")


def check_chain_output(result: Any, rule: str, draft_tokens: Tensor, num_draft_tokens: Tensor,
                       vocab_size: int) -> VerifyOutput:
    """``result`` of chain rule ``rule`` as a checked :class:`~specdecode.VerifyOutput`.

    Shape:
        result: ``(tokens [B, gamma+1] int64, accepted_len [B] int64)`` (a ``VerifyOutput`` or a
            pair); draft_tokens: ``[B, gamma]`` int64; num_draft_tokens: ``[B]`` int64.

    ``TypeError`` for a wrong container, type or dtype; ``ValueError`` for a wrong shape,
    ``accepted_len[b]`` outside ``[0, num_draft_tokens[b]]``, an accepted position that does not
    hold the drafted token, an emitted token outside ``[0, vocab_size)`` or anything but -1 after
    it. Meta tensors are checked for type and shape only.
    """
    tokens, accepted_len = _unpack(result, rule, "rule", ("tokens", "accepted_len"))
    B, gamma = draft_tokens.shape
    device = draft_tokens.device
    tokens = _check_field("rule", rule, "tokens", tokens, (B, gamma + 1), "[B, gamma+1]", device)
    accepted_len = _check_field("rule", rule, "accepted_len", accepted_len, (B,), "[B]", device)
    if device.type == "meta":
        return VerifyOutput(tokens, accepted_len)
    bad = (accepted_len < 0) | (accepted_len > num_draft_tokens)
    if bool(bad.any()):
        b = _first(bad)[0]
        raise ValueError(f"rule {rule!r} returned accepted_len[{b}] = {int(accepted_len[b])}, outside "
                         f"[0, num_draft_tokens[{b}]] = [0, {int(num_draft_tokens[b])}]")
    accepted = torch.arange(gamma, device=device)[None, :] < accepted_len[:, None]
    bad = accepted & (tokens[:, :gamma] != draft_tokens)
    if bool(bad.any()):
        b, i = _first(bad)
        raise ValueError(f"rule {rule!r} returned tokens[{b}, {i}] = {int(tokens[b, i])} at an accepted position, "
                         f"but the draft there is {int(draft_tokens[b, i])} (accepted positions must hold the drafted "
                         "tokens)")
    _check_emitted("rule", rule, tokens, accepted_len, vocab_size)
    return VerifyOutput(tokens, accepted_len)


class TreeRuleOutput(NamedTuple):
    """What a tree rule returns, checked (the fields of ``TreeVerifyOutput``, untrimmed).

    Shape:
        tokens: ``[B, W]`` int64; accepted_len: ``[B]`` int64; accepted_nodes: ``[B, W]`` int64.
    """

    tokens: Tensor
    accepted_len: Tensor
    accepted_nodes: Tensor


def check_tree_output(result: Any, rule: str, tree_tokens: Tensor, parents: Tensor, num_nodes: Tensor,
                      depth: int, vocab_size: int) -> TreeRuleOutput:
    """``result`` of tree rule ``rule`` checked against the tree it verified.

    Shape:
        result: ``(tokens [B, D+1], accepted_len [B], accepted_nodes [B, D+1])``, int64, ``D`` =
            ``depth`` (the deepest tree of the batch); a ``TreeVerifyOutput`` is such a triple.
        tree_tokens, parents: ``[B, N]`` int64; num_nodes: ``[B]`` int64.

    ``accepted_nodes[b]`` must be a path from the root: node 0, then ``accepted_len[b]`` nodes
    each a child of the one before (``-1`` after); ``tokens[b, j]`` must be the token of the
    j-th accepted node, then one emitted token in ``[0, vocab_size)``, then ``-1``.
    """
    tokens, accepted_len, nodes = _unpack(result, rule, "tree rule", ("tokens", "accepted_len", "accepted_nodes"))
    B, N = tree_tokens.shape
    device = tree_tokens.device
    width = depth + 1
    tokens = _check_field("tree rule", rule, "tokens", tokens, (B, width), "[B, max_depth+1]", device)
    accepted_len = _check_field("tree rule", rule, "accepted_len", accepted_len, (B,), "[B]", device)
    nodes = _check_field("tree rule", rule, "accepted_nodes", nodes, (B, width), "[B, max_depth+1]", device)
    if device.type == "meta":
        return TreeRuleOutput(tokens, accepted_len, nodes)
    bad = (accepted_len < 0) | (accepted_len > depth)
    if bool(bad.any()):
        b = _first(bad)[0]
        raise ValueError(f"tree rule {rule!r} returned accepted_len[{b}] = {int(accepted_len[b])}, outside "
                         f"[0, max_depth] = [0, {depth}]")
    slot = torch.arange(width, device=device)[None, :]
    on_path = slot <= accepted_len[:, None]
    if bool((nodes[:, 0] != 0).any()):
        b = _first(nodes[:, 0] != 0)[0]
        raise ValueError(f"tree rule {rule!r} returned accepted_nodes[{b}, 0] = {int(nodes[b, 0])}; a path starts "
                         "at the root, node 0")
    bad = on_path & ((nodes < 0) | (nodes >= num_nodes[:, None]))
    bad |= ~on_path & (nodes != -1)
    if bool(bad.any()):
        b, j = _first(bad)
        expected = f"a node in [0, num_nodes[{b}]) = [0, {int(num_nodes[b])})" if on_path[b, j] else "-1 padding"
        raise ValueError(f"tree rule {rule!r} returned accepted_nodes[{b}, {j}] = {int(nodes[b, j])}; expected "
                         f"{expected}")
    safe = nodes.clamp(0, N - 1)
    steps = on_path[:, 1:] & (parents.gather(1, safe[:, 1:]) != safe[:, :-1])
    if bool(steps.any()):
        b, j = _first(steps)
        raise ValueError(f"tree rule {rule!r} returned accepted_nodes[{b}, {j + 1}] = {int(nodes[b, j + 1])}, which "
                         f"is not a child of node {int(nodes[b, j])} (the accepted nodes must form a path)")
    accepted = slot[:, :-1] < accepted_len[:, None]
    path_tokens = tree_tokens.gather(1, safe[:, 1:])
    bad = accepted & (tokens[:, :-1] != path_tokens)
    if bool(bad.any()):
        b, j = _first(bad)
        raise ValueError(f"tree rule {rule!r} returned tokens[{b}, {j}] = {int(tokens[b, j])}, but accepted node "
                         f"{int(nodes[b, j + 1])} holds {int(path_tokens[b, j])} (accepted positions must hold the "
                         "drafted tokens)")
    _check_emitted("tree rule", rule, tokens, accepted_len, vocab_size)
    return TreeRuleOutput(tokens, accepted_len, nodes)
