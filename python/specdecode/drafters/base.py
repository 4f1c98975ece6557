"""The drafter protocol: how the engine asks for guesses and tells what was accepted.

A drafter proposes draft tokens for every active row of the batch; the engine scores them with
the target in one forward pass, verifies them with a rule, and then tells the drafter what was
kept, so it can roll its own state (a KV cache, an n-gram index, text) forward or back. The
engine knows drafters only through this module.

Three objects cross the boundary:

- :class:`DraftState` (engine -> drafter, read-only): the batch as the drafter may see it: the
  column layout shared with the target's KV cache (token ids, attention mask and position ids
  per column; the last committed column holds each row's *pending* token, the one the next
  target forward starts from), every row's real context, the sampling settings, randomness,
  and the Hugging Face logits processors to apply to draft logits.
- :class:`Proposal` (drafter -> engine): ``k`` draft tokens per row and the logits each was
  sampled from, or ``None`` for a deterministic proposal (a point mass: verification then uses
  a one-hot ``q``, which keeps sampling lossless).
- :class:`CommitUpdate` (engine -> drafter): per row how many drafts were accepted, how many
  columns are now committed, which rows continue, and how the committed columns moved when the
  engine re-packed the batch.

Write your own drafter by implementing :class:`Drafter` (see ``tests/test_drafters.py`` for a
tiny one written in the test file).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from specdecode.sampling import SamplingParams

if TYPE_CHECKING:  # pragma: no cover
    from specdecode.trees import TokenTree


@runtime_checkable
class DraftState(Protocol):
    """What a drafter may read at one step. Rows are the *active* rows (finished rows have left
    the batch); ``row_ids`` maps them to the caller's batch.

    Shape:
        tokens, attention_mask, positions: ``[b, >= num_columns]`` int64 — the column buffers;
            columns ``[0, num_columns)`` are committed, column ``num_columns - 1`` holds the
            pending token (never in any cache yet). ``attention_mask`` is 1 for a real token,
            0 for left padding or a hole left by a rejected draft; ``positions`` count real
            tokens only.
        row_ids: ``[b]`` int64 — each active row's index in the caller's batch.
    """

    @property
    def tokens(self) -> Tensor: ...

    @property
    def attention_mask(self) -> Tensor: ...

    @property
    def positions(self) -> Tensor: ...

    @property
    def num_columns(self) -> int: ...

    @property
    def has_holes(self) -> bool: ...

    @property
    def row_ids(self) -> Tensor: ...

    @property
    def batch_size(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def sampling(self) -> SamplingParams: ...

    @property
    def generator(self) -> torch.Generator | None: ...

    def contexts(self) -> list[Tensor]:
        """Every active row's real tokens so far (prompt without padding, then every emitted
        token, the pending one last), as 1-D int64 tensors."""
        ...

    def uniforms(self, *shape: int) -> Tensor:
        """Fresh float64 coins in [0, 1) from the generation's generator, on ``device``."""
        ...

    def process_draft_logits(self, logits: Tensor, drafted: Tensor) -> Tensor:
        """Apply the generation's Hugging Face logits processors to draft logits.

        Shape:
            logits: ``[b, V]`` float32 at draft position ``i``; drafted: ``[b, i]`` the tokens
            drafted before it in this step. Returns ``[b, V]`` (``logits`` itself without
            processors).
        """
        ...

    def clock(self) -> float:
        """Seconds (after synchronising the devices in use), for the drafter's own timings."""
        ...


@dataclass
class SideTokens:
    """Tokens a drafter adds to the target's tree forward for its own use, beside the tree:
    the target computes their logits in the same pass (``CommitUpdate.side_logits``), and
    verification never sees them (Lookahead decoding's lookahead branch).

    Every side token attends to its row's committed prefix and to the tree's root (the
    pending token), never to the draft nodes; among the side tokens, ``mask`` says who sees
    whom. Their cache columns are dropped when the step commits.

    Shape:
        tokens: ``[b, S]`` int64 — the side tokens (ids below the target's vocabulary).
        positions: ``[b, S]`` int64 — their position ids (the pending token's position + offset).
        mask: ``[S, S]`` bool — ``mask[i, j]``: side token ``i`` attends to side token ``j``
            (the diagonal must be True); the same for every row.
    """

    tokens: Tensor
    positions: Tensor
    mask: Tensor


@dataclass
class Proposal:
    """What a drafter proposes for one step.

    Shape:
        draft_tokens: ``[b, k]`` int64 — ``x_1..x_k`` per row, on the state's device.
        draft_logits: ``[b, k, V]`` float — the logits ``x_i`` was sampled from, *after* the
            Hugging Face processors and before the sampling settings (verification applies
            temperature / top-k / top-p / min-p itself, exactly as
            :func:`specdecode.sampling.sample_logits` did); ``None`` when the proposal is a
            deterministic function of the context (n-grams, re-encoded text, argmax drafts
            at temperature 0).
        num_draft_tokens: ``[b]`` int64 or None — row ``b`` proposes only its first
            ``num_draft_tokens[b]`` tokens (0..k); None means k for every row.
        tree: a :class:`~specdecode.trees.TokenTree` or None — a tree proposal (node 0 is the
            pending token); then ``draft_tokens`` are the tree's tokens ``[b, N]`` and
            ``draft_logits`` ``[b, N, V]`` give, per node, the distribution its children were
            drawn from.

    ``children`` (trees only) says how each node's children were drafted:
    ``"deterministic"`` (a function of the context), ``"iid"`` (i.i.d. draws from ``q``) or
    ``"without_replacement"``; it decides which tree rule verifies the tree losslessly.
    ``forward_calls`` counts the drafter's model forward passes for this proposal and
    ``prefill_seconds`` the part of its time spent on prefilling (both feed the statistics).
    ``side`` (trees only): :class:`SideTokens` scored in the same target forward for the
    drafter's own use.
    """

    draft_tokens: Tensor
    draft_logits: Tensor | None = None
    num_draft_tokens: Tensor | None = None
    tree: TokenTree | None = None
    children: str | None = None
    forward_calls: int = 0
    prefill_seconds: float = 0.0
    side: SideTokens | None = None

    @property
    def is_deterministic(self) -> bool:
        """True when the tokens are not samples (no draft distribution to verify against)."""
        return self.draft_logits is None

    @property
    def num_tokens(self) -> int:
        """``k``: draft tokens per row (tree: nodes per row, root included)."""
        return int(self.draft_tokens.shape[1])


@dataclass
class CommitUpdate:
    """What verification kept at one step, for the drafter to roll its state.

    Shape:
        accepted_len: ``[b]`` int64 — accepted drafts per row of the step (before any row left).
        kept_rows: ``[b']`` int64 or None — the rows that continue, in their new order (None:
            every row continues).
        column_order: ``[b', num_columns]`` int64 or None — set when the engine re-packed the
            batch after this step: committed column ``j`` of row ``r`` now holds what column
            ``column_order[r, j]`` held (rows already reduced to ``kept_rows``).
        accepted_nodes: ``[b, D+1]`` int64 or None — tree steps: the node indices of each
            row's accepted path (root first, -1 padded).
        target_logits: ``[b, k+1, V]`` (chain) or ``[b, N, V]`` (tree) float32 — the target's
            scored logits of the step, one row per scored column (before any row left): what
            Jacobi iteration reads.
        side_logits: ``[b, S, V]`` float32 or None — the target's logits at the proposal's
            :class:`SideTokens`.
        features: ``[b, m, F]`` or None — only for drafters that declare ``feature_layers``:
            the target's hidden states (at those layers, concatenated) of the ``m`` committed
            columns just before the new pending one, ``num_columns - 1 - m .. num_columns - 2``
            (before any re-pack, rows before any left): at a step, the old pending token and
            the drafts of the longest accepted run (tree steps: along the accepted path); a row
            that accepted fewer drafts has holes in the columns beyond its own run.

    A drafter with ``feature_layers`` also gets one commit right after the prompt's prefill
    (``accepted_len`` zeros, ``num_columns`` the prompt block, ``features`` the prompt's columns
    except the pending one), before its first ``propose``.

    ``num_columns`` is the number of committed columns after the step *before* any re-pack;
    the last of them holds each row's new pending token. Columns before ``num_columns - 1``
    that a drafter computed for its own proposal stay valid (the engine masks the rejected
    ones as holes); anything a drafter cached at or beyond ``num_columns - 1`` is stale.
    """

    accepted_len: Tensor
    num_columns: int
    kept_rows: Tensor | None = None
    column_order: Tensor | None = None
    accepted_nodes: Tensor | None = None
    target_logits: Tensor | None = None
    side_logits: Tensor | None = None
    features: Tensor | None = None


@runtime_checkable
class Drafter(Protocol):
    """Proposes draft tokens. ``reset`` starts a new generation (and ends one); ``propose`` is
    called once per step with the number of draft tokens wanted (a drafter may propose fewer,
    per row, through ``Proposal.num_draft_tokens``, or a shorter ``k``); ``commit`` follows
    every step, and every re-pack of the batch.

    Optional attributes the engine reads when present: ``name`` (str, for statistics),
    ``device`` (a ``torch.device`` the drafter computes on, synchronised for timings) and
    ``max_columns`` (int: the drafter cannot attend over more cache columns, e.g. a cache
    that keeps only so many) and ``feature_layers`` (a tuple of indices into the target's
    ``hidden_states``, or None: the target's hidden states the drafter reads, handed over in
    :attr:`CommitUpdate.features` from the verification forward itself; a drafter without it
    gets none and the target is not asked for them).
    """

    def reset(self) -> None: ...

    def propose(self, state: DraftState, num_tokens: int) -> Proposal: ...

    def commit(self, update: CommitUpdate) -> None: ...


@runtime_checkable
class StaticDraftState(Protocol):
    """What a drafter reads on the static decode path (:mod:`specdecode.engine.static_loop`).

    Every tensor is a persistent buffer: its contents change from step to step, its address
    never does, so work recorded once into a CUDA graph reads the current values at each replay.
    The layout is :mod:`specdecode.models.static_cache`'s: row ``b``'s real tokens occupy columns
    ``start[b] .. lengths[b]``; columns ``[start[b], lengths[b])`` are committed (in the target's
    cache) and column ``lengths[b]`` holds the row's *pending* token (the last one emitted).
    Between two steps the engine moves each row's length past the columns it committed (the
    pending token and the accepted drafts) and writes the new pending token; it never calls
    ``commit``. Whatever a drafter cached for columns below ``lengths[b] - 1`` was computed
    from tokens that are still committed, so it stays valid; anything at or beyond is stale.

    A drafter with ``feature_layers`` also reads ``features``: the target's hidden states at
    those layers (concatenated) for every column, written by the target forwards that wrote the
    column's keys and values (the prompt's prefill, each step's score forward), valid where the
    column is committed (``start[b] <= c < lengths[b]``; the rejected drafts' features lie beyond
    and are stale), as :mod:`specdecode.engine.static_features` describes.

    Shape:
        tokens: ``[B, capacity]`` int64 — the token of every column (drafts of the current step
            after the pending column; stale values beyond).
        lengths, start: ``[B]`` int64.
        features: ``[B, capacity, F]`` (the target's dtype) or None — None for drafters that
            declare no ``feature_layers``.
    """

    @property
    def tokens(self) -> Tensor: ...

    @property
    def lengths(self) -> Tensor: ...

    @property
    def start(self) -> Tensor: ...

    @property
    def capacity(self) -> int: ...

    @property
    def features(self) -> Tensor | None: ...

    @property
    def prompt_columns(self) -> int:
        """Committed columns of every row when decoding starts (all rows equal): the prompt
        block; the first pending token sits at this column."""
        ...

    @property
    def batch_size(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def sampling(self) -> SamplingParams: ...

    def sample(self, logits: Tensor) -> Tensor:
        """One token per row from ``logits [B, V]`` (float32) with the generation's sampling
        settings, graph-safe: argmax at temperature 0, else the compiled sampler with coins
        from the generation's Philox counter (advanced on the device). Returns ``[B]`` int64.
        Verification later reads the same logits as ``q``."""
        ...

    def buffer(self, name: str, factory: Any) -> Any:
        """A persistent object for this drafter (``factory()`` on first use): the same one for
        every generation that reuses this static layout, so that captured graphs stay valid."""
        ...


@runtime_checkable
class StaticDrafter(Protocol):
    """A drafter that can run on the static decode path: fixed shapes, no host synchronisation
    while proposing (every step may be recorded once into a CUDA graph and replayed).

    - ``static_key()``: what the drafter computes with, as a hashable tuple that names models by
      ``weakref.ref(model)`` (e.g. ``("model", weakref.ref(model))``), never by ``id()``, which
      a new model can reuse; graphs captured for one key are replayed for another drafter with
      an equal key, and a layout whose key names a freed model is dropped.
    - ``static_prefill(state, num_tokens)``: before the first step, outside any graph (may
      synchronise): prepare its buffers for ``state`` and absorb the committed prompt columns.
    - ``static_propose(state, num_tokens)``: exactly ``num_tokens`` drafts per row (finished
      rows too: their results are ignored), returned as ``(draft_tokens [B, k] int64,
      draft_logits [B, k, V] float32)``, each token drawn with ``state.sample`` from the logits
      returned for it. Must not read tensor values on the host.
    """

    def static_key(self) -> Any: ...

    def static_prefill(self, state: StaticDraftState, num_tokens: int) -> None: ...

    def static_propose(self, state: StaticDraftState, num_tokens: int) -> tuple[Tensor, Tensor]: ...


class TreeBuilderDrafter:
    """For drafters whose ``tree`` attribute is a :class:`~specdecode.trees.builders.TreeBuilder`
    (None: chains) and whose ``reset`` clears every per-generation state: :meth:`with_tree`."""

    tree: Any = None

    def with_tree(self, tree: Any = "dynamic", num_nodes: int = 16, tree_depth: int | None = None,
                  tree_children: str | None = None) -> Any:
        """A copy of this drafter, sharing its model, that drafts token trees built by
        :func:`~specdecode.trees.builders.make_tree_builder` (``generate``'s ``tree=``,
        ``num_nodes``, ``tree_depth`` and ``tree_children`` land here; this drafter is not
        modified): ``"dynamic"`` (EAGLE-2), ``"sequoia"``, ``"static"``, a shape, rank paths or
        a builder; None for a copy that drafts chains.

        Example:
            >>> tree_drafter = drafter.with_tree("dynamic", num_nodes=6, tree_depth=3)  # doctest: +SKIP
            >>> out = specdecode.generate(target, tree_drafter, ids, max_new_tokens=32)  # doctest: +SKIP
        """
        import copy

        from specdecode.trees.builders import make_tree_builder

        if tree is None and (tree_depth is not None or tree_children is not None):
            raise ValueError("tree: tree_depth / tree_children need a tree (None drafts chains)")
        builder = None if tree is None else make_tree_builder(tree, num_nodes=num_nodes, max_depth=tree_depth,
                                                              children=tree_children)
        clone = copy.copy(self)
        clone.tree = builder
        clone.sampling_drafter = None  # settings chosen here hold at every temperature
        clone.reset()
        return clone


class DrafterBase:
    """Convenience base for drafters: no-op ``reset`` / ``commit`` and the checks the engine
    runs on every proposal (:meth:`check_proposal`). Subclasses implement ``propose``."""

    #: Shown in statistics and benchmark tables.
    name: str = "drafter"
    #: Most cache columns the drafter can attend over, or None (a model's own sliding-window
    #: layers need nothing here: their windows are masks, specdecode.models.layer_masks).
    max_columns: int | None = None
    #: Draft tokens per step ``generate`` uses when not told (None: its default, 5); a trained
    #: drafter's record may set it (``specdecode.load_drafter``).
    default_num_draft_tokens: int | None = None
    #: The drafter ``generate`` uses instead when it samples and is given no ``tree=`` (None:
    #: this one); a trained drafter's record may set it, e.g. a chain at T > 0 where a tree pays
    #: only greedily (``specdecode.load_drafter``).
    sampling_drafter: Any = None
    #: True: ``propose`` may run on the host between the steps of the static decode path
    #: (:mod:`specdecode.engine.host_drafts`): it returns deterministic chains (or tries, with
    #: ``num_nodes`` and ``tree_depth``), reads only the layout of :class:`DraftState` (no
    #: coins, no processors) and needs from ``commit`` only ``accepted_len`` and ``kept_rows``.
    static_host_drafts: bool = False

    def reset(self) -> None:  # noqa: D102
        return None

    def for_sampling(self) -> Any:
        """The drafter to use when generation samples: :attr:`sampling_drafter`, else this one."""
        return self if self.sampling_drafter is None else self.sampling_drafter

    def commit(self, update: CommitUpdate) -> None:  # noqa: D102
        return None

    def propose(self, state: DraftState, num_tokens: int) -> Proposal:  # pragma: no cover - abstract
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """Settings worth reporting (benchmarks, stats)."""
        return {"drafter": self.name}


def check_proposal(proposal: Any, batch_size: int, vocab_size: int, num_tokens: int, device: torch.device,
                   drafter: Any) -> Proposal:
    """The engine's checks of a chain proposal: types, shapes, devices and token ranges, with
    errors that name the drafter. Returns the proposal."""
    who = type(drafter).__name__
    if not isinstance(proposal, Proposal):
        raise TypeError(f"{who}.propose: expected a specdecode.drafters.Proposal, got {type(proposal).__name__}")
    tokens = proposal.draft_tokens
    if not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.shape[0] != batch_size:
        shape = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
        raise ValueError(f"{who}.propose: draft_tokens must have shape [b, k] = [{batch_size}, k], got {shape}")
    if tokens.dtype != torch.int64 or tokens.device != device:
        raise ValueError(f"{who}.propose: draft_tokens must be int64 on {device}, got {tokens.dtype} on {tokens.device}")
    k = tokens.shape[1]
    if proposal.tree is None and k > num_tokens:
        raise ValueError(f"{who}.propose: proposed {k} tokens per row, more than the {num_tokens} asked for")
    counts = proposal.num_draft_tokens
    if counts is not None:
        if not isinstance(counts, Tensor) or tuple(counts.shape) != (batch_size,) or counts.dtype != torch.int64:
            raise ValueError(f"{who}.propose: num_draft_tokens must be an int64 tensor of shape [{batch_size}]")
        if counts.device != device:
            raise ValueError(f"{who}.propose: num_draft_tokens must be on {device}, got {counts.device}")
    if proposal.draft_logits is not None:
        logits = proposal.draft_logits
        if not isinstance(logits, Tensor) or tuple(logits.shape) != (batch_size, k, vocab_size):
            shape = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
            raise ValueError(
                f"{who}.propose: draft_logits must have shape [b, k, V] = [{batch_size}, {k}, {vocab_size}], got {shape}"
            )
    if proposal.side is not None:
        _check_side(proposal, batch_size, vocab_size, device, who)
    return proposal


def _check_side(proposal: Proposal, batch_size: int, vocab_size: int, device: torch.device, who: str) -> None:
    side = proposal.side
    if not isinstance(side, SideTokens):
        raise TypeError(f"{who}.propose: side must be a specdecode.drafters.SideTokens, got {type(side).__name__}")
    if proposal.tree is None:
        raise ValueError(f"{who}.propose: side tokens go with a tree proposal (tree=...), not with a chain")
    for name in ("tokens", "positions"):
        value = getattr(side, name)
        if not isinstance(value, Tensor) or value.dim() != 2 or value.shape[0] != batch_size:
            shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
            raise ValueError(f"{who}.propose: side.{name} must have shape [b, S] = [{batch_size}, S], got {shape}")
        if value.dtype != torch.int64 or value.device != device:
            raise ValueError(f"{who}.propose: side.{name} must be int64 on {device}, got {value.dtype} on {value.device}")
    count = side.tokens.shape[1]
    if tuple(side.positions.shape) != (batch_size, count):
        raise ValueError(f"{who}.propose: side.positions must have the shape of side.tokens, {(batch_size, count)}")
    mask = side.mask
    if not isinstance(mask, Tensor) or tuple(mask.shape) != (count, count) or mask.dtype != torch.bool:
        shape = tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"{who}.propose: side.mask must be a bool tensor of shape [S, S] = [{count}, {count}], got "
                         f"{shape}")
    if count and not bool(mask.diagonal().all()):
        raise ValueError(f"{who}.propose: side.mask must let every side token attend to itself (its diagonal)")
    if count and (int(side.tokens.min()) < 0 or int(side.tokens.max()) >= vocab_size):
        raise ValueError(f"{who}.propose: side.tokens must be token ids in [0, {vocab_size})")


def point_mass_logits(draft_tokens: Tensor, vocab_size: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """Logits whose processed distribution is one-hot on each draft token (0 there, -inf
    elsewhere), whatever the sampling settings: how a deterministic proposal is verified by
    the rules that read ``q``.

    Shape:
        draft_tokens: ``[b, k]`` int64 in ``[0, vocab_size)``. Returns ``[b, k, vocab_size]``.
    """
    logits = torch.full((*draft_tokens.shape, vocab_size), float("-inf"), dtype=dtype, device=draft_tokens.device)
    logits.scatter_(2, draft_tokens.clamp(0, vocab_size - 1)[..., None], 0.0)
    return logits


