"""Host drafters on the static decode path: drafters that propose on the host between two
steps (prompt lookup, suffix retrieval: no model, nothing to record) and feed a static,
compiled or CUDA-graphed step their deterministic chains.

A drafter opts in with ``static_host_drafts = True`` (:class:`~specdecode.drafters.NgramDrafter`,
:class:`~specdecode.drafters.SuffixDrafter`). Its ``propose`` then sees a :class:`HostView` (a
:class:`~specdecode.drafters.DraftState` built on the CPU from the static layout) and must propose
deterministically (``draft_logits`` None): chains, or tries when it has ``num_nodes`` (its
``tree_depth`` bounds their depth; :func:`host_tree_plan`). Its ``commit`` gets only
``accepted_len``, ``num_columns`` and ``kept_rows`` (the view is rebuilt at every step: no
``column_order``), one step late: just before the next ``propose``. A drafter that runs a model
of its own on the host between steps (:class:`~specdecode.drafters.TokenizerBridgeDrafter`'s draft
model, with its own cache) opts in the same way; its ``forward_calls`` are counted.

:class:`HostDrafts` keeps persistent device buffers that the recorded step reads. Chains: the
proposals padded to ``k`` tokens per row (``tokens [B, k]``) and how many of them each row
proposed (``counts [B]``; the verify phase verifies no more). Tries: a
:class:`~specdecode.trees.static_growth.StaticTreeDraft` of ``num_nodes`` slots per row (``tree``;
a row's unused slots repeat its root with parent 0, as the static tree step pads). Its
:meth:`~HostDrafts.step` is the only host work of a step
(:class:`~specdecode.engine.graphs.StepProgram`'s ``host``): one read of the layout (tokens,
lengths, start, finished rows, the last step's accepted lengths) and the copies of the proposals
in. Padding is lossless: a padded position or slot is never verified.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from torch import Tensor

from specdecode.drafters.base import CommitUpdate, Proposal
from specdecode.sampling import SamplingParams
from specdecode.trees.static_growth import StaticTreeDraft, StaticTreePlan


def is_host_drafter(drafter: Any) -> bool:
    """Whether ``drafter`` proposes on the host on the static path (``static_host_drafts``)."""
    return bool(getattr(drafter, "static_host_drafts", False))


def host_drafts_tree(drafter: Any) -> bool:
    """Whether a host drafter is set to draft tries (``num_nodes``) or any other tree."""
    return getattr(drafter, "num_nodes", None) is not None or getattr(drafter, "tree", None) is not None


def host_tree_plan(drafter: Any) -> StaticTreePlan:
    """The fixed plan of a host drafter's tries on the static path: ``num_nodes`` slots (root
    included), depth at most ``tree_depth`` (and ``num_nodes - 1``); ``ValueError`` naming
    ``tree`` for a host drafter that drafts trees without both."""
    num_nodes, depth = getattr(drafter, "num_nodes", None), getattr(drafter, "tree_depth", None)
    if not isinstance(num_nodes, int) or not isinstance(depth, int) or num_nodes < 2 or depth < 1:
        raise ValueError(f"tree: {type(drafter).__name__} drafts trees on the host, which the static decode path runs "
                         "as tries sized by num_nodes (>= 2) and tree_depth (>= 1); it has num_nodes="
                         f"{num_nodes!r}, tree_depth={depth!r} (use decode_path='eager')")
    return StaticTreePlan("host", num_nodes, min(depth, num_nodes - 1), "deterministic")


class HostView:
    """The :class:`~specdecode.drafters.DraftState` of a host drafter at one static step: the
    active rows' real tokens left-padded so that every row's pending token is the last column.
    CPU tensors; no randomness and no processors (deterministic proposals need neither).

    Shape:
        tokens, attention_mask, positions: ``[b, W]`` int64, ``W`` the longest row (pending
            token included); row_ids: ``[b]`` int64, the rows' indices in the batch.
    """

    def __init__(self, tokens: np.ndarray, mask: np.ndarray, rows: np.ndarray, vocab_size: int,
                 sampling: SamplingParams) -> None:
        self._tokens = torch.from_numpy(tokens)
        self._mask = torch.from_numpy(mask)
        self._positions = (self._mask.cumsum(1) - 1).clamp_min(0) * self._mask
        self._rows = torch.from_numpy(rows)
        self._holes = not bool(mask.all())
        self._vocab, self._sampling = vocab_size, sampling

    tokens = property(lambda self: self._tokens)
    attention_mask = property(lambda self: self._mask)
    positions = property(lambda self: self._positions)
    num_columns = property(lambda self: int(self._tokens.shape[1]))
    has_holes = property(lambda self: self._holes)  # left padding only, as the eager path counts it
    row_ids = property(lambda self: self._rows)
    batch_size = property(lambda self: int(self._tokens.shape[0]))
    vocab_size = property(lambda self: self._vocab)
    device = property(lambda self: torch.device("cpu"))
    sampling = property(lambda self: self._sampling)
    generator = property(lambda self: None)

    def contexts(self) -> list[Tensor]:
        return [row[mask.bool()] for row, mask in zip(self._tokens, self._mask)]

    def uniforms(self, *shape: int) -> Tensor:
        raise RuntimeError("draft: a host drafter on the static decode path proposes deterministically; it has no "
                           "coins (use decode_path='eager')")

    def process_draft_logits(self, logits: Tensor, drafted: Tensor) -> Tensor:
        return logits  # the static path runs no processors

    def clock(self) -> float:
        return time.perf_counter()


def layout_view(tokens: np.ndarray, lengths: np.ndarray, start: np.ndarray, rows: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``rows`` of the static layout (row ``b``: columns ``start[b] .. lengths[b]``, the
    pending token last), left-padded to the longest: ``(tokens, mask)``, both ``[len(rows), W]``.

    >>> t, m = layout_view(np.array([[0, 4, 5, 6], [0, 0, 7, 8]]), np.array([3, 3]), np.array([1, 2]),
    ...                    np.array([0, 1]))
    >>> t.tolist(), m.tolist()
    ([[4, 5, 6], [0, 7, 8]], [[1, 1, 1], [0, 1, 1]])
    """
    lengths, start = lengths[rows], start[rows]
    width = int((lengths - start).max()) + 1 if len(rows) else 1
    index = lengths[:, None] - (width - 1) + np.arange(width)[None, :]
    mask = (index >= start[:, None]).astype(np.int64)
    picked = np.take_along_axis(tokens[rows], np.clip(index, 0, tokens.shape[1] - 1), 1)
    return picked * mask, mask


class HostDrafts:
    """The persistent proposal buffers of one static layout and the host step that fills them.

    Shape:
        tokens: ``[B, k]`` int64 — every row's chain, padded with its pending token.
        counts: ``[B]`` int64 — the drafts each row proposed (0 for finished rows).
        tree (tries, ``plan`` given): tokens and parents ``[B, N]`` int64, num_nodes ``[B]``
            (1 for a row that proposed nothing), ``N = plan.num_nodes``.
    """

    def __init__(self, batch: int, k: int, device: torch.device, plan: StaticTreePlan | None = None) -> None:
        self.k, self.device = k, device
        pinned = device.type == "cuda"
        width = k if plan is None else plan.num_nodes
        self.max_depth = k if plan is None else plan.max_depth
        self.tokens = torch.zeros((batch, width), dtype=torch.long, device=device)
        self.counts = torch.zeros(batch, dtype=torch.long, device=device)
        # contiguous host copies (pinned on CUDA: copied in without blocking); tries: parents too
        self._host_tokens = torch.zeros((batch, width), dtype=torch.long, pin_memory=pinned)
        self._host_counts = torch.zeros(batch, dtype=torch.long, pin_memory=pinned)
        self.tree: StaticTreeDraft | None = None
        if plan is not None:
            self.parents = torch.zeros((batch, width), dtype=torch.long, device=device)
            self._host_parents = torch.zeros((batch, width), dtype=torch.long, pin_memory=pinned)
            offsets = torch.arange(width, device=device).expand(batch, -1).contiguous()
            self.tree = StaticTreeDraft(self.tokens, self.parents, self.counts, None, offsets)
        self._rows: np.ndarray | None = None  # rows of the last proposal of this generation
        self.seconds = 0.0  # host time of this generation's proposals
        self.forward_calls = 0  # the drafter's model forwards in them (Proposal.forward_calls)

    def begin(self) -> None:
        """A new generation: no proposal yet (nothing to commit), nothing counted."""
        self._rows = None
        self.seconds, self.forward_calls = 0.0, 0
        self.counts.fill_(0 if self.tree is None else 1)

    def step(self, drafter: Any, state: Any, finished: Tensor, accepted: Tensor | None, syncs: Any) -> None:
        """Read the layout once, commit the last step's accepted lengths, propose, copy in."""
        t0 = time.perf_counter()
        B, capacity = state.tokens.shape
        parts = [state.tokens.flatten(), state.lengths, state.start, finished.long()]
        if self._rows is not None and accepted is not None:
            parts.append(accepted.long())
        host = syncs.fetch(torch.cat(parts)).numpy()
        tokens = host[: B * capacity].reshape(B, capacity)
        lengths, start, done = (host[B * capacity + i * B: B * capacity + (i + 1) * B] for i in range(3))
        rows = np.flatnonzero(done == 0)
        if len(parts) == 5:
            last = host[B * capacity + 3 * B:]
            assert self._rows is not None
            kept = np.flatnonzero(done[self._rows] == 0)  # rows only leave: the survivors, in their order
            drafter.commit(CommitUpdate(torch.from_numpy(np.maximum(last[self._rows], 0)),
                                        int((lengths - start).max()) + 1,
                                        None if len(kept) == len(self._rows) else torch.from_numpy(kept)))
        # (the fetch above waited for the device, so the last step's copies from these are done)
        out, out_counts = self._host_tokens.numpy(), self._host_counts.numpy()
        pending = tokens[np.arange(B), lengths]
        out[:] = pending[:, None]
        out_counts[:] = 0 if self.tree is None else 1
        if self.tree is not None:
            out_parents = self._host_parents.numpy()
            out_parents[:] = 0
            out_parents[:, 0] = -1
        if len(rows):
            view_tokens, mask = layout_view(tokens, lengths, start, rows)
            view = HostView(view_tokens, mask, rows.astype(np.int64), state.vocab_size, state.sampling)
            proposal = drafter.propose(view, self.k)
            self.forward_calls += int(getattr(proposal, "forward_calls", 0) or 0)
            if self.tree is None:
                drafts, counts = self._checked(drafter, proposal, len(rows), state.vocab_size)
                width = drafts.shape[1]
                filled = np.arange(width)[None, :] < counts[:, None]
                out[rows, :width] = np.where(filled, drafts, pending[rows, None])
                out_counts[rows] = counts
            else:
                nodes, parents, sizes = self._checked_tree(drafter, proposal, len(rows), state.vocab_size)
                width = nodes.shape[1]
                used = np.arange(width)[None, :] < sizes[:, None]
                out[rows, 1:width] = np.where(used, nodes, pending[rows, None])[:, 1:]
                out_parents[rows, 1:width] = np.where(used, parents, 0)[:, 1:]
                out_counts[rows] = sizes
        self._rows = rows
        cuda = self.device.type == "cuda"
        self.tokens.copy_(self._host_tokens, non_blocking=cuda)
        self.counts.copy_(self._host_counts, non_blocking=cuda)
        if self.tree is not None:
            self.parents.copy_(self._host_parents, non_blocking=cuda)
        self.seconds += time.perf_counter() - t0

    def _checked(self, drafter: Any, proposal: Any, b: int, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
        """A host proposal's tokens ``[b, <= k]`` and counts ``[b]`` as NumPy, after refusing what
        the static step cannot verify (``ValueError`` naming the argument)."""
        who = type(drafter).__name__
        if not isinstance(proposal, Proposal):
            raise TypeError(f"{who}.propose: expected a specdecode.drafters.Proposal, got {type(proposal).__name__}")
        if proposal.tree is not None:
            raise ValueError(f"tree: {who} proposed a token tree, but it has no num_nodes; host drafters draft tries "
                             "sized by num_nodes on the static decode path (or use decode_path='eager')")
        if proposal.draft_logits is not None:
            raise ValueError(f"draft: {who} proposed sampled drafts (draft_logits); a host drafter on the static "
                             "decode path must propose deterministically (draft_logits None); use decode_path='eager'")
        drafts = proposal.draft_tokens.detach().cpu().numpy()
        if drafts.ndim != 2 or drafts.shape[0] != b or drafts.shape[1] > self.k:
            raise ValueError(f"{who}.propose: draft_tokens must have shape [b, <= k] = [{b}, <= {self.k}], got "
                             f"{tuple(drafts.shape)}")
        width = drafts.shape[1]
        if width == 0:  # no row found anything: a plain decoding step
            return drafts.astype(np.int64), np.zeros(b, dtype=np.int64)
        counts = proposal.num_draft_tokens
        counts = np.full(b, width) if counts is None else counts.detach().cpu().numpy()
        counts = np.clip(counts, 0, width)
        bad = (drafts < 0) | (drafts >= vocab_size)
        # an id the target cannot score ends a row's proposal
        counts = np.minimum(counts, np.where(bad.any(1), bad.argmax(1), width))
        return np.where(bad, 0, drafts), counts

    def _checked_tree(self, drafter: Any, proposal: Any, b: int, vocab_size: int
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A host proposal as tries: node tokens and parents ``[b, n <= N]`` and sizes ``[b]``
        (a chain becomes a path; nothing proposed: the root alone), after refusing tries the
        plan cannot hold (``ValueError`` naming ``tree``) or ids the target cannot score."""
        who, N = type(drafter).__name__, self.tokens.shape[1]
        if isinstance(proposal, Proposal) and proposal.tree is None:
            if proposal.draft_logits is not None:
                raise ValueError(f"draft: {who} proposed sampled drafts (draft_logits); a host drafter on the static "
                                 "decode path must propose deterministically; use decode_path='eager'")
            drafts, counts = self._checked(drafter, proposal, b, vocab_size)
            width = min(drafts.shape[1], N - 1, self.max_depth)
            nodes = np.concatenate([np.zeros((b, 1), np.int64), drafts[:, :width]], 1)
            parents = np.arange(-1, width)[None, :].repeat(b, 0)
            return nodes, parents, 1 + np.minimum(counts, width)
        if not isinstance(proposal, Proposal):
            raise TypeError(f"{who}.propose: expected a specdecode.drafters.Proposal, got {type(proposal).__name__}")
        tree = proposal.tree
        nodes, parents = tree.tokens.detach().cpu().numpy(), tree.parents.detach().cpu().numpy()
        sizes = tree.num_nodes.detach().cpu().numpy().astype(np.int64)
        if nodes.shape[0] != b or sizes.max(initial=1) > N:
            raise ValueError(f"tree: {who} proposed tries of up to {int(sizes.max(initial=1))} nodes for {nodes.shape[0]} "
                             f"rows; the static decode path holds {N} nodes (num_nodes) for {b} rows")
        width = int(sizes.max(initial=1))
        nodes, parents = nodes[:, :width], parents[:, :width]
        used = np.arange(width)[None, :] < sizes[:, None]
        depth = np.zeros(nodes.shape, dtype=np.int64)
        for j in range(1, width):  # parents come first: one pass in index order
            depth[:, j] = depth[np.arange(b), np.clip(parents[:, j], 0, width - 1)] + 1
        if (used & (depth > self.max_depth)).any():
            raise ValueError(f"tree: {who} proposed a trie deeper than {self.max_depth} (tree_depth); the static decode "
                             "path verifies no deeper")
        index = np.arange(1, width)[None, :]
        if (used[:, 1:] & ((parents[:, 1:] < 0) | (parents[:, 1:] >= index))).any():
            raise ValueError(f"tree: {who} proposed a trie whose parents are not in topological order "
                             "(0 <= parents[b, i] < i)")
        if (used[:, 1:] & ((nodes[:, 1:] < 0) | (nodes[:, 1:] >= vocab_size))).any():
            raise ValueError(f"draft: {who} proposed a token id outside the target's vocabulary [0, {vocab_size})")
        return nodes, parents, sizes
