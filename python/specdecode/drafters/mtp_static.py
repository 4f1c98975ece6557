""":class:`~specdecode.drafters.mtp.MTPDrafter` on the static decode path: chains and rank-path
trees, with no host read while drafting (every step may be recorded into a CUDA graph).

The target features come from the engine's device buffer
(:mod:`specdecode.engine.static_features`) and the MTP layers keep a static cache
(:class:`~specdecode.models.static_cache.ColumnCache`) on the engine's columns: layer ``j``'s entry
at column ``c`` reads the target feature of column ``c - 1`` (layer 0) or layer ``j - 1``'s
output at ``c``, and the token of column ``c + j``, at position ``c - start + j``; the row's first
real column is hidden from every other query (transformers keeps no entry for the first token).
With ``k`` drafts per step (a tree: its depth) only the first ``k`` layers run, each over the
``2k`` columns up to the pending one: the last step's entries that read drafts and the columns
it accepted all lie among them, so every entry before the window read committed tokens only.

A rank-path tree then runs layer ``j`` (``j = 1 .. D - 1``) once over the nodes of depth
``1 .. j``, each at its own scratch column after the pending one (the pending column plus its
node index), as :meth:`~specdecode.drafters.mtp.MTPDrafter` does on the eager path: a node reads
its parent's layer ``j - 1`` output (a depth-1 node: the window's, ``j - 1`` columns before the
pending one) and its own token, at the pending position plus its depth, and sees the window's
columns up to ``j`` before the pending one, its ancestors and itself.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from specdecode.drafters.base import StaticDraftState
from specdecode.drafters.last_feature import static_features_at, static_rank_tree
from specdecode.trees.shapes import TreeShape
from specdecode.trees.static_growth import StaticTreeDraft, StaticTreePlan

__all__ = ["prefill", "propose_chain", "propose_tree", "tree_plan", "window"]


def window(drafter: Any, state: StaticDraftState, columns: Tensor, positions: Tensor, mask: Tensor,
           num_layers: int, draws: int) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
    """Feed layers ``0 .. num_layers - 1`` over ``columns``; layer ``j < draws`` draws draft
    ``j + 1`` at the pending column (``state.sample``); a token past the pending column is the
    draft there (the pending token where none is drawn: those entries are fed again later).

    Shape: columns, positions ``[B, n]``; mask ``[B, 1, n, keys]``. Returns the drafts ``[B]``,
    their logits ``[B, V]`` and every layer's outputs ``[B, n, H]``."""
    B, n = columns.shape
    dtype = drafter._dtype()
    hidden = static_features_at(state, columns - 1).to(dtype)
    cap = state.tokens.shape[1]
    pending = state.lengths[:, None]
    at_pending = (state.lengths - columns[:, 0]).clamp(0, n - 1)[:, None, None]
    keys = torch.arange(mask.shape[-1], device=columns.device)[None, None, :]
    hide = (keys == state.start[:, None, None]) & (keys != columns[:, :, None])  # the first real column
    mask = mask.masked_fill(hide[:, None], torch.finfo(dtype).min)
    pad = state.tokens.gather(1, state.lengths[:, None])
    tokens: list[Tensor] = []
    used: list[Tensor] = []
    outs: list[Tensor] = []
    for j in range(num_layers):
        drafts = torch.cat([t[:, None] for t in tokens] + [pad] * (num_layers - len(tokens)), 1)
        read = columns + j
        own = state.tokens.gather(1, read.clamp_max(cap - 1))
        drafted = drafts.gather(1, (read - pending - 1).clamp(0, num_layers - 1))
        drafter._static_cache.columns = columns
        hidden = drafter._run_layer(j, torch.where(read > pending, drafted, own), hidden, positions + j, mask,
                                    drafter._static_cache)
        outs.append(hidden)
        if j < draws:
            logits = drafter._logits(state, hidden.gather(1, at_pending.expand(B, 1, hidden.shape[-1]))[:, 0])
            tokens.append(state.sample(logits))
            used.append(logits)
    return tokens, used, outs


@torch.no_grad()
def prefill(drafter: Any, state: StaticDraftState, num_tokens: int) -> None:
    """Refuse more drafts per step than layers (``ValueError`` naming ``num_draft_tokens``: the
    static path drafts exactly that many), then feed the prompt's columns the first step does not
    re-feed (it feeds the ``2 * num_tokens`` columns up to the pending one; a tree: its depth)."""
    from specdecode.models.static_cache import ColumnCache, prefill_inputs

    if num_tokens > drafter.num_layers:
        raise ValueError(f"num_draft_tokens: MTPDrafter has {drafter.num_layers} MTP layers, one draft each; the "
                         f"static decode path drafts exactly num_draft_tokens = {num_tokens} per step")
    drafter._static_cache = state.buffer("mtp_cache", lambda: ColumnCache(state.capacity))
    width = state.prompt_columns + 1 - 2 * num_tokens
    if width > 0 and num_tokens > 0:
        with prefill_inputs(drafter._static_cache, state.start, width, drafter._dtype()) as (columns, positions, mask):
            window(drafter, state, columns, positions, mask, num_tokens, 0)


def _window_inputs(drafter: Any, state: StaticDraftState, num_tokens: int) -> tuple[Tensor, Tensor, Tensor]:
    from specdecode.models.static_cache import column_inputs

    first = (state.lengths + 1 - 2 * num_tokens).clamp_min(0)  # a short prompt: the window starts at column 0
    return column_inputs(first, state.start, 2 * num_tokens, state.capacity, drafter._dtype())


@torch.no_grad()
def propose_chain(drafter: Any, state: StaticDraftState, num_tokens: int) -> tuple[Tensor, Tensor]:
    """Layers ``0 .. num_tokens - 1`` over the ``2 * num_tokens`` columns up to the pending one,
    draft ``j + 1`` from layer ``j`` at the pending column; no host read.

    Shape: returns ``[B, num_tokens]`` int64 and ``[B, num_tokens, V]`` float32."""
    columns, positions, mask = _window_inputs(drafter, state, num_tokens)
    tokens, used, _ = window(drafter, state, columns, positions, mask, num_tokens, num_tokens)
    return torch.stack(tokens, 1), torch.stack(used, 1)


def tree_plan(drafter: Any, vocab_size: int) -> StaticTreePlan:
    """The tree of the rank paths, the same at every step, its children the layers' top ranks
    (``deterministic``); ``ValueError`` naming ``tree`` for a chain drafter or a rank past the
    vocabulary."""
    if drafter.choices is None:
        raise ValueError("tree: this MTPDrafter drafts chains (tree=None); pass rank paths as tree=")
    _, ranks, parents, width = drafter._layout
    if width > vocab_size:
        raise ValueError(f"tree: a path asks for the rank-{width - 1} token, but the vocabulary has {vocab_size} ids")
    shape = TreeShape(tuple(parents.tolist()), child_rank=(-1, *ranks.tolist()))
    return StaticTreePlan("shape", shape.num_nodes, shape.max_depth, "deterministic", shape=shape)


@torch.no_grad()
def propose_tree(drafter: Any, state: StaticDraftState, plan: StaticTreePlan) -> StaticTreeDraft:
    """The window over the ``2 D`` columns up to the pending one (``D`` the tree's depth), then
    one forward of layer ``j`` per depth ``j = 1 .. D - 1`` over the nodes of depth ``1 .. j``
    (see the module docstring); no host read.

    Shape: returns a :class:`~specdecode.trees.static_growth.StaticTreeDraft` of ``N`` nodes."""
    depth_of, ranks, parents, width = drafter._layout  # on the host: fixed per plan (moved once)
    D = plan.max_depth
    columns, positions, mask = _window_inputs(drafter, state, D)
    _, _, outs = window(drafter, state, columns, positions, mask, D, 0)
    dev, dtype = state.device, drafter._dtype()
    B, H, cap = state.batch_size, outs[0].shape[-1], state.capacity
    node_depth, node_rank, parent, family, levels = state.buffer(f"mtp_tree:{plan.key}", lambda: (
        (depth_of + 1).to(dev), ranks.to(dev), (parents[1:] - 1).to(dev), drafter._ancestry.to(dev),
        [(fed.to(dev), here.to(dev)) for fed, here in drafter._levels]))
    lengths, start = state.lengths, state.start
    first = columns[:, 0]
    at_pending = (lengths - first).clamp(0, columns.shape[1] - 1)[:, None, None].expand(B, 1, H)
    root = state.tokens.gather(1, lengths[:, None])
    pick = drafter._logits(state, outs[0].gather(1, at_pending)[:, 0]).topk(width, -1).indices
    tokens = root.repeat(1, node_depth.numel())
    tokens = torch.where(node_depth == 1, pick.gather(1, node_rank[None].expand(B, -1)), tokens)
    keys = torch.arange(cap, device=dev)[None, :]
    table = None  # [B, N - 1, H]: the last layer's output at each node
    for j, (fed_t, here_t) in enumerate(levels, start=1):
        m = fed_t.numel()
        node_columns = (lengths[:, None] + 1 + fed_t[None]).clamp_max(cap - 1)
        index = (lengths - j + 1 - first).clamp(0, columns.shape[1] - 1)[:, None, None].expand(B, 1, H)
        root_hidden = outs[j - 1].gather(1, index)
        if table is None:
            hidden = root_hidden.expand(B, m, H)
        else:
            up = parent[fed_t]
            from_table = table.gather(1, up.clamp_min(0)[None, :, None].expand(B, m, H))
            hidden = torch.where((up < 0)[None, :, None], root_hidden, from_table)
        seen = (keys > start[:, None]) & (keys <= (lengths - j)[:, None])  # window entries of committed tokens
        exists = (lengths - start - j)[:, None] + node_depth[fed_t][None, :] >= 1  # [B, m]
        among = (family[fed_t][:, fed_t][None] & exists[:, None, :]) | torch.eye(m, dtype=torch.bool, device=dev)
        allowed = seen[:, None, :].expand(B, m, cap).clone()
        allowed.scatter_(2, node_columns[:, None, :].expand(B, m, m), among)
        allowed |= seen[:, None, :]
        step_mask = torch.zeros(allowed.shape, dtype=dtype, device=dev).masked_fill(~allowed, torch.finfo(dtype).min)
        drafter._static_cache.columns = node_columns
        out = drafter._run_layer(j, tokens[:, fed_t], hidden, (lengths - start)[:, None] + node_depth[fed_t][None],
                                 step_mask[:, None], drafter._static_cache)
        table = out.new_zeros((B, node_depth.numel(), H)).index_copy(1, fed_t, out)
        top = drafter._logits(state, table.index_select(1, parent[here_t])).topk(width, -1).indices
        chosen = top.gather(2, node_rank[here_t][None, :, None].expand(B, -1, 1))[:, :, 0]
        tokens = tokens.index_copy(1, here_t, chosen)
    return static_rank_tree(state, plan, torch.cat([root, tokens], 1))
