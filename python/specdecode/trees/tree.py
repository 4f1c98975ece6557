"""The batch-of-token-trees data structure.

>>> import torch
>>> from specdecode.trees import TokenTree
>>> # row 0: root 5 with children 7, 8; node 1 (token 7) has child 9. Row 1: a 2-node chain.
>>> tree = TokenTree(tokens=torch.tensor([[5, 7, 8, 9], [3, 4, 0, 0]]),
...                  parents=torch.tensor([[-1, 0, 0, 1], [-1, 0, -1, -1]]),
...                  num_nodes=torch.tensor([4, 2]))
>>> tree.validate()
>>> tree.depth
tensor([[0, 1, 1, 2],
        [0, 1, 0, 0]])
>>> tree.max_depth
2
>>> TokenTree.chain(torch.tensor([5]), torch.tensor([[7, 9]])).parents
tensor([[-1,  0,  1]])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

#: Largest number of node slots N the compiled tree ops accept (``kMaxTreeNodes`` in C++).
MAX_TREE_NODES = 4096


def _require_long(name: str, value: Any, ndim: int, shape_text: str) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of shape {shape_text}, got {type(value).__name__}")
    if value.dim() != ndim:
        raise ValueError(f"{name}: expected shape {shape_text}, got {tuple(value.shape)}")
    if value.dtype != torch.int64:
        raise TypeError(f"{name}: expected int64, got {value.dtype}")
    return value


@dataclass(frozen=True)
class TokenTree:
    """A batch of token trees, one per row, each with at most N nodes in topological order.

    Node 0 of a row is its root: the last committed token, whose target distribution gives the
    first draft position (in a chain it is the pending token). Every other node is a draft
    token; its parent comes before it. Slots ``i >= num_nodes[b]`` are padding and are ignored
    (their values may be anything). The children of a node, in index order, are the order in
    which they were drafted, which is the order verification tries them in.

    Shape:
        tokens: ``[B, N]`` int64 — the node tokens.
        parents: ``[B, N]`` int64 — ``parents[b, 0] = -1``; ``0 <= parents[b, i] < i`` for
            ``0 < i < num_nodes[b]``.
        num_nodes: ``[B]`` int64 — nodes in use per row, in ``[1, N]``.

    Construction checks types, shapes and devices; :meth:`validate` checks the values (one
    host synchronisation). ``N`` may be at most :data:`MAX_TREE_NODES` for the compiled ops.
    """

    tokens: Tensor
    parents: Tensor
    num_nodes: Tensor

    def __post_init__(self) -> None:
        _require_long("parents", self.parents, 2, "[B, N]")
        B, N = self.parents.shape
        _require_long("tokens", self.tokens, 2, f"[B, N] = [{B}, {N}]")
        _require_long("num_nodes", self.num_nodes, 1, f"[B] = [{B}]")
        if tuple(self.tokens.shape) != (B, N):
            raise ValueError(f"tokens: expected shape [B, N] = [{B}, {N}] (that of parents), got {tuple(self.tokens.shape)}")
        if self.num_nodes.shape[0] != B:
            raise ValueError(f"num_nodes: expected shape [B] = [{B}], got {tuple(self.num_nodes.shape)}")
        if N < 1:
            raise ValueError(f"parents: a tree needs at least one node slot (the root), got shape {(B, N)}")
        for name in ("tokens", "num_nodes"):
            device = getattr(self, name).device
            if device != self.parents.device:
                raise ValueError(f"{name}: expected device {self.parents.device} (that of parents), got {device}")

    # ------------------------------------------------------------------------------ sizes

    @property
    def batch_size(self) -> int:
        """B, the number of rows."""
        return int(self.parents.shape[0])

    @property
    def max_nodes(self) -> int:
        """N, the number of node slots per row."""
        return int(self.parents.shape[1])

    @property
    def device(self) -> torch.device:
        """The device of the three tensors."""
        return self.parents.device

    # ------------------------------------------------------------------------ validation

    def validate(self) -> None:
        """Raise ``ValueError`` naming ``num_nodes`` or ``parents`` when a row is not a tree:
        ``num_nodes[b]`` outside ``[1, N]``, ``parents[b, 0] != -1``, or a real node whose parent
        does not come before it. Token values are checked by the ops (they need ``V``)."""
        B, N = self.batch_size, self.max_nodes
        if B == 0:
            return
        bad_count = (self.num_nodes < 1) | (self.num_nodes > N)
        if bool(bad_count.any()):
            b = int(torch.nonzero(bad_count)[0])
            raise ValueError(f"num_nodes: row {b} has num_nodes = {int(self.num_nodes[b])}, expected a value in [1, N] = [1, {N}]")
        bad_root = self.parents[:, 0] != -1
        if bool(bad_root.any()):
            b = int(torch.nonzero(bad_root)[0])
            raise ValueError(f"parents: row {b}: parents[{b}, 0] = {int(self.parents[b, 0])}, expected -1 (node 0 is the root)")
        index = torch.arange(N, device=self.device)[None, :]
        real = (index > 0) & (index < self.num_nodes[:, None])
        bad = real & ((self.parents < 0) | (self.parents >= index))
        if bool(bad.any()):
            b, i = (int(v) for v in torch.nonzero(bad)[0])
            raise ValueError(
                f"parents: row {b}, node {i} has parent {int(self.parents[b, i])}; every node 0 < i < num_nodes[b] "
                "needs 0 <= parents[b, i] < i (topological order)"
            )

    # ---------------------------------------------------------------------------- derived

    @property
    def depth(self) -> Tensor:
        """Depth of every node (root 0; padding slots 0), by pointer jumping: ``log2(N)`` rounds
        of gathers, no host synchronisation. Meaningful for valid trees only.

        Shape: ``[B, N]`` int64.
        """
        B, N = self.batch_size, self.max_nodes
        index = torch.arange(N, device=self.device)[None, :]
        real = (index > 0) & (index < self.num_nodes[:, None])
        # jump[i]: the node `dist[i]` edges above i, or -1 once dist[i] is i's full depth.
        jump = torch.where(real, self.parents.clamp(0, N - 1), -1)
        dist = real.long()
        for _ in range(max(1, N.bit_length())):
            has = jump >= 0
            target = jump.clamp_min(0)
            dist = dist + torch.where(has, dist.gather(1, target), 0)
            jump = torch.where(has, jump.gather(1, target), -1)
        return dist

    @property
    def max_depth(self) -> int:
        """The largest depth over all rows (0 for root-only trees). One host synchronisation."""
        if self.batch_size == 0:
            return 0
        return int(self.depth.max())

    def to(self, device: torch.device | str) -> TokenTree:
        """The same trees on ``device``."""
        return TokenTree(self.tokens.to(device), self.parents.to(device), self.num_nodes.to(device))

    # ------------------------------------------------------------------------ constructors

    @classmethod
    def chain(cls, root_tokens: Tensor, draft_tokens: Tensor, num_draft_tokens: Tensor | None = None) -> TokenTree:
        """A chain of k drafts as a tree: ``parents = [-1, 0, 1, ..., k-1]``.

        Shape:
            root_tokens: ``[B]`` int64 — the last committed (pending) token of each row.
            draft_tokens: ``[B, k]`` int64.
            num_draft_tokens: ``[B]`` int64 in ``[0, k]`` or None (all k) — row b uses its first
                ``num_draft_tokens[b]`` drafts: ``num_nodes = num_draft_tokens + 1``.
            returns: a tree with ``N = k + 1``.
        """
        _require_long("root_tokens", root_tokens, 1, "[B]")
        _require_long("draft_tokens", draft_tokens, 2, "[B, k]")
        B, k = draft_tokens.shape
        if root_tokens.shape[0] != B:
            raise ValueError(f"root_tokens: expected shape [B] = [{B}] (from draft_tokens), got {tuple(root_tokens.shape)}")
        device = draft_tokens.device
        if root_tokens.device != device:
            raise ValueError(f"root_tokens: expected device {device} (that of draft_tokens), got {root_tokens.device}")
        if num_draft_tokens is None:
            num_nodes = torch.full((B,), k + 1, dtype=torch.int64, device=device)
        else:
            _require_long("num_draft_tokens", num_draft_tokens, 1, f"[B] = [{B}]")
            if num_draft_tokens.shape[0] != B:
                raise ValueError(f"num_draft_tokens: expected shape [B] = [{B}], got {tuple(num_draft_tokens.shape)}")
            if num_draft_tokens.device != device:
                raise ValueError(f"num_draft_tokens: expected device {device}, got {num_draft_tokens.device}")
            num_nodes = num_draft_tokens + 1
        tokens = torch.cat([root_tokens[:, None], draft_tokens], 1)
        parents = torch.arange(-1, k, dtype=torch.int64, device=device).expand(B, k + 1).contiguous()
        return cls(tokens, parents, num_nodes)
