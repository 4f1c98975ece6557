"""The speculative decoding engine: one step is propose -> score -> verify -> commit.

1. **propose**: the drafter (any :class:`~specdecode.drafters.Drafter`) proposes ``k`` tokens
   per active row, reading the batch through :class:`DraftView`.
2. **score**: the target scores ``[pending, x_1 .. x_k]`` in one forward pass (``k + 1``
   distributions), its logits processed by the Hugging Face processors.
3. **verify**: :func:`specdecode.verify_logits` with the generation's rule and sampling
   settings picks each row's accepted length ``tau`` and one more token. A deterministic
   proposal is verified against a point-mass ``q``.
4. **commit**: emitted tokens go to the outputs (cut at EOS, ``max_new_tokens`` and stopping
   criteria), the batch layout advances (rejected columns become holes), the target's cache is
   cropped, the drafter is told what was kept, finished rows leave, holes are re-packed.

The batch layout is described in :mod:`specdecode.engine.batch`.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

from specdecode.drafters.base import CommitUpdate, Drafter, Proposal, check_proposal, point_mass_logits
from specdecode.engine.batch import BatchState
from specdecode.engine.processors import ProcessorRunner
from specdecode.engine.settings import EngineSettings
from specdecode.engine.stats import Clock, SpeculativeStats
from specdecode.engine.syncs import HostSyncs
from specdecode.models import facts, kv_cache
from specdecode.rules import get_rule, is_chain_rule
from specdecode.sampling import SamplingParams, sample_logits
from specdecode.trees import TokenTree, list_tree_rules, tree_attention_mask, verify_tree
from specdecode.trees.builders import LOSSLESS_RULE
from specdecode.trees.rules import LOSSLESS_CHILDREN, is_tree_rule
from specdecode.verify import verify_logits


class DraftView:
    """The :class:`~specdecode.drafters.DraftState` the engine hands to its drafter."""

    def __init__(self, batch: BatchState, settings: EngineSettings, processors: ProcessorRunner,
                 clock: Clock) -> None:
        self._batch, self._settings, self._processors, self._clock = batch, settings, processors, clock

    @property
    def tokens(self) -> Tensor:
        return self._batch.tokens

    @property
    def attention_mask(self) -> Tensor:
        return self._batch.mask

    @property
    def positions(self) -> Tensor:
        return self._batch.positions

    @property
    def num_columns(self) -> int:
        return self._batch.pending + 1

    @property
    def has_holes(self) -> bool:
        return self._batch.holes

    @property
    def row_ids(self) -> Tensor:
        return self._batch.rows

    @property
    def batch_size(self) -> int:
        return self._batch.num_active

    @property
    def vocab_size(self) -> int:
        return self._settings.vocab_size

    @property
    def device(self) -> torch.device:
        return self._batch.device

    @property
    def sampling(self) -> SamplingParams:
        return self._settings.sampling

    @property
    def generator(self) -> torch.Generator | None:
        return self._settings.generator

    def contexts(self) -> list[Tensor]:
        return self._batch.contexts()

    def uniforms(self, *shape: int) -> Tensor:
        gen = self._settings.generator
        device = gen.device if gen is not None else self._batch.device
        return torch.rand(shape, dtype=torch.float64, device=device, generator=gen).to(self._batch.device)

    def process_draft_logits(self, logits: Tensor, drafted: Tensor) -> Tensor:
        return self._processors.process(logits, drafted)

    def clock(self) -> float:
        return self._clock()


class SpeculativeEngine:
    """Runs speculative generations of ``target`` with ``drafter`` under ``settings``.

    ``target`` is a Hugging Face causal LM on one device or sharded by an existing engine
    (``device_map``, tensor parallelism): inputs go to the device of its input embeddings.
    """

    def __init__(self, target: torch.nn.Module, drafter: Drafter, settings: EngineSettings,
                 stats: SpeculativeStats | None = None) -> None:
        self.target = target
        self.drafter = drafter
        self.settings = settings
        self.stats = stats if stats is not None else SpeculativeStats()
        self.device = facts.input_device(target)
        # The chain rule (None when the rule named is a tree rule only); tree rules are checked per proposal.
        self.rule = get_rule(settings.rule or "token") if is_chain_rule(settings.rule or "token") else None
        self._logits_to_keep_ok = facts.accepts_logits_to_keep(target)
        self._tree_checked = False
        windows = [w for w in (facts.sliding_window(target), getattr(drafter, "max_columns", None)) if w is not None]
        self.window = min(windows) if windows else None

    # ------------------------------------------------------------------ public
    @torch.no_grad()
    def generate(self, input_ids: Tensor, attention_mask: Tensor | None) -> Tensor:
        """Generate for a checked, left-padded batch; returns ``[B, L + new]`` sequences.

        Shape:
            input_ids: ``[B, L]`` int64; attention_mask: ``[B, L]`` 0/1 or None.
        """
        s, stats = self.settings, self.stats
        if s.streamer is not None and input_ids.shape[0] != 1:
            raise ValueError(
                f"streamer: streaming needs batch size 1 (as Hugging Face's streamers), got {input_ids.shape[0]}"
            )
        if self.window is not None and input_ids.shape[1] + s.max_new_tokens > self.window:
            raise ValueError(
                f"max_new_tokens: prompt_len + max_new_tokens = {input_ids.shape[1] + s.max_new_tokens} exceeds the "
                f"sliding window ({self.window}); sliding-window attention is only supported within the window"
            )
        devices = [self.device] + [d for d in (getattr(self.drafter, "device", None),) if isinstance(d, torch.device)]
        self.syncs = HostSyncs()
        self.clock = Clock(*devices, syncs=self.syncs)
        self.batch = BatchState(input_ids, attention_mask, device=self.device, max_new_tokens=s.max_new_tokens,
                                pad_id=s.pad_id, max_step_columns=s.schedule.maximum, syncs=self.syncs)
        self.processors = ProcessorRunner(self.batch, s.processors, s.stopping, s.pad_id, self.syncs)
        self.view = DraftView(self.batch, s, self.processors, self.clock)
        self.cache = kv_cache.new_cache()
        self.eos = torch.tensor(s.eos_ids, dtype=torch.long, device=self.device) if s.eos_ids else None
        self.drafter.reset()
        stats.rule = self.rule.name if self.rule is not None else (s.rule or "token")
        stats.drafter = getattr(self.drafter, "name", type(self.drafter).__name__)
        stats.batch_size = self.batch.batch
        stats.draft_schedule = getattr(s.schedule, "name", type(s.schedule).__name__)
        stats.decode_path = "eager"
        if s.streamer is not None:
            s.streamer.put(self.syncs.fetch(self.batch.sequences[:, : self.batch.prompt_len]))
        try:
            self._prefill()
            while self.batch.num_active > 0:
                self.syncs.stepping = True
                more = self._step()
                self.syncs.stepping = False
                if not more:
                    break
            self.syncs.stepping = False
            if s.streamer is not None:
                s.streamer.end()
            self.drafter.reset()
            new = self.syncs.integer(self.batch.generated.max()) if self.batch.batch else 0
        finally:
            stats.host_syncs += self.syncs.total
            stats.step_host_syncs += self.syncs.in_steps
        return self.batch.sequences[:, : self.batch.prompt_len + new]

    # ------------------------------------------------------------------ phases
    def _prefill(self) -> None:
        b = self.batch
        if b.pending == 0:
            return
        t0 = self.clock()
        facts.forward(self.target, b.tokens[:, : b.pending], b.attention(b.pending), b.positions[:, : b.pending],
                      self.cache, last_only=True, logits_to_keep_ok=self._logits_to_keep_ok)
        dt = self.clock() - t0
        self.stats.target_calls += 1
        self.stats.target_prefill_calls += 1
        self.stats.target_time += dt
        self.stats.target_prefill_time += dt

    def _plan(self) -> tuple[int, Tensor]:
        """Draft tokens for this step and each row's remaining budget ``[b]``."""
        b, s = self.batch, self.settings
        remaining = s.max_new_tokens - b.generated[b.rows]
        remaining_max = self.syncs.integer(remaining.max())
        gamma = max(min(s.schedule.num_draft_tokens(), remaining_max - 1), 0)
        return self._fit_window(gamma), remaining

    def _fit_window(self, gamma: int) -> int:
        """Sliding-window models see the window in cache columns here: when a step would pass
        it, re-pack the rows, then draft fewer tokens; refuse only when not even the pending
        token fits (the prompt + max_new_tokens check up front makes that unlikely)."""
        b = self.batch
        if self.window is None or b.pending + gamma + 1 <= self.window:
            return gamma
        self._forced_repack()
        if b.pending + 1 > self.window:
            raise RuntimeError(
                f"the batch needs {b.pending + 1} cache columns, more than the model's sliding window "
                f"({self.window}); sliding-window attention is only supported within the window"
            )
        return min(gamma, self.window - b.pending - 1)

    def _propose(self, gamma: int) -> Proposal:
        t0 = self.clock()
        proposal = self.drafter.propose(self.view, gamma)
        check_proposal(proposal, self.batch.num_active, self.settings.vocab_size, gamma, self.device, self.drafter)
        self.stats.draft_time += self.clock() - t0
        self.stats.draft_calls += proposal.forward_calls
        self.stats.draft_prefill_time += proposal.prefill_seconds
        return proposal

    def _score(self, draft_tokens: Tensor | None) -> Tensor:
        """Target logits ``[b, k + 1, V]`` (float32, processors applied) at the pending token
        and after each draft."""
        b, s = self.batch, self.settings
        t0 = self.clock()
        p = b.pending
        k = 0 if draft_tokens is None else draft_tokens.shape[1]
        logits = facts.forward(self.target, b.tokens[:, p: p + k + 1], b.attention(p + k + 1),
                               b.positions[:, p: p + k + 1], self.cache, last_only=False,
                               logits_to_keep_ok=self._logits_to_keep_ok)
        logits = logits[:, :, : s.vocab_size].to(device=self.device, dtype=torch.float32)
        if self.processors.processors is not None:
            logits = torch.stack([self.processors.process(logits[:, i], draft_tokens[:, :i] if k else None)
                                  for i in range(k + 1)], 1)
        self.stats.target_calls += 1
        self.stats.target_time += self.clock() - t0
        return logits

    def _verify(self, target_logits: Tensor, proposal: Proposal | None, remaining: Tensor
                ) -> tuple[Tensor, Tensor, Tensor]:
        """``(tokens [b, k+1], accepted_len [b], verified drafts [b])``."""
        s, b = self.settings, self.batch
        t0 = self.clock()
        n = b.num_active
        if proposal is None or proposal.num_tokens == 0:  # a plain decoding step
            coins = None if s.sampling.is_greedy else self.view.uniforms(n)
            tokens = sample_logits(target_logits[:, 0], s.sampling, uniforms=coins)[:, None]
            zeros = torch.zeros(n, dtype=torch.long, device=self.device)
            self.stats.verify_time += self.clock() - t0
            return tokens, zeros, zeros
        k = proposal.num_tokens
        verified = (remaining - 1).clamp(0, k)
        if proposal.num_draft_tokens is not None:
            verified = torch.minimum(verified, proposal.num_draft_tokens)
        draft_logits = None
        if self.rule is None:
            raise ValueError(f"rule: {s.rule!r} is a tree rule, but the drafter proposed a chain; use a chain rule "
                             "(specdecode.list_rules()) or draft a tree")
        if self.rule.needs_draft_probs or not self.rule.builtin:
            draft_logits = proposal.draft_logits
            if draft_logits is None:
                draft_logits = point_mass_logits(proposal.draft_tokens, s.vocab_size)
        result = verify_logits(
            target_logits.contiguous(), draft_logits, proposal.draft_tokens, sampling=s.sampling, rule=self.rule.name,
            num_draft_tokens=verified, uniforms=self.view.uniforms(n, k + 1), **s.rule_options,
        )
        if self.device.type == "cuda" and self.rule.builtin:
            self.syncs.count()  # the CUDA op copies its per-row statuses to the host to raise bad input
        self.stats.verify_time += self.clock() - t0
        return result.tokens.to(self.device), result.accepted_len.to(self.device), verified

    def _emit(self, tokens: Tensor, accepted_len: Tensor, remaining: Tensor) -> tuple[Tensor, Tensor]:
        """Write each row's new tokens to the outputs; returns kept counts and finished rows."""
        b, s = self.batch, self.settings
        width = tokens.shape[1]
        idx = torch.arange(width, device=self.device)
        keep = accepted_len + 1
        finished = torch.zeros(b.num_active, dtype=torch.bool, device=self.device)
        if self.eos is not None:
            is_eos = torch.isin(tokens, self.eos) & (idx[None, :] < keep[:, None])
            has_eos = is_eos.any(1)
            keep = torch.where(has_eos, is_eos.to(torch.int8).argmax(1) + 1, keep)
            finished = has_eos
        keep = torch.minimum(keep, remaining)
        generated = b.generated[b.rows]
        cols = torch.where(idx[None, :] < keep[:, None], b.prompt_len + generated[:, None] + idx[None, :],
                           b.width - 1)
        b.sequences[b.rows[:, None].expand_as(cols), cols] = tokens
        if self.processors.stopping is not None:
            keep, stopped = self.processors.check_stopping(keep)
            finished = finished | stopped
        b.generated[b.rows] = generated + keep
        finished = finished | (generated + keep >= s.max_new_tokens)
        return keep, finished

    def _count(self, gamma: int, accepted_h: Tensor, keep_h: Tensor, verified_h: Tensor) -> None:
        stats = self.stats
        stats.steps += 1
        stats.row_steps += int(accepted_h.numel())
        stats.new_tokens += int(keep_h.sum())
        stats.num_draft_tokens_history.append(gamma)
        if gamma == 0:
            return
        stats.drafted_tokens += int(verified_h.sum())
        stats.accepted_tokens += int(accepted_h.sum())
        stats.rejections += int((accepted_h < verified_h).sum())
        while len(stats.position_drafted) < gamma:
            stats.position_drafted.append(0)
            stats.position_accepted.append(0)
        positions = torch.arange(gamma)
        for i, (d, a) in enumerate(zip((verified_h[:, None] > positions).sum(0).tolist(),
                                       (accepted_h[:, None] > positions).sum(0).tolist())):
            stats.position_drafted[i] += d
            stats.position_accepted[i] += a

    def _repack(self, force: bool = False) -> Tensor | None:
        order = self.batch.repack_order(force)
        if order is not None:
            self.batch.repack(order, self.cache)
            self.stats.repacks += 1
        return order

    def _forced_repack(self) -> None:
        """Re-pack before a step (sliding windows) and tell the drafter; nothing was accepted."""
        pending = self.batch.pending
        order = self._repack(force=True)
        if order is not None:
            accepted = torch.zeros(self.batch.num_active, dtype=torch.long, device=self.device)
            self.drafter.commit(CommitUpdate(accepted_len=accepted, num_columns=pending + 1, column_order=order))

    # ------------------------------------------------------------------ trees
    def _tree_rule(self, proposal: Proposal) -> str:
        """The tree rule for a proposal: the one asked for, if it is lossless for (or does not
        care about) the proposal's children scheme; else the scheme's own lossless rule."""
        s = self.settings
        children = proposal.children or "deterministic"
        if s.rule is None:
            return LOSSLESS_RULE[children]
        if not is_tree_rule(s.rule):
            raise ValueError(f"rule: {s.rule!r} is a chain rule, but the drafter proposed a token tree; tree rules: "
                             f"{', '.join(r.name for r in list_tree_rules())} (or rule=None for the lossless one)")
        allowed = LOSSLESS_CHILDREN.get(s.rule)
        if allowed is not None and children not in allowed:
            raise ValueError(
                f"rule: {s.rule!r} is lossless only for children drafted {' or '.join(allowed)}, but this tree's "
                f"children are {children}; use rule={LOSSLESS_RULE[children]!r} (or rule=None)"
            )
        return s.rule

    def _score_tree(self, tree: TokenTree) -> Tensor:
        """Target logits ``[b, N, V]`` at every node of ``tree`` (root = pending token), one
        forward with the tree attention mask and positions."""
        b, s = self.batch, self.settings
        if self.processors.processors is not None:
            raise ValueError("logits_processor: Hugging Face logits processors are not supported with token trees "
                             "(each node has its own context); draft a chain (tree=None) to use them")
        if not self._tree_checked:
            facts.check_tree_attention(self.target, "target")
            self._tree_checked = True
        t0 = self.clock()
        p = b.pending
        b.ensure_capacity(p + tree.max_nodes + 2)
        masks = tree_attention_mask(tree, b.mask[:, :p], b.positions[:, p])
        dtype = getattr(self.target, "dtype", torch.float32)
        logits = facts.forward(self.target, tree.tokens, masks.additive_mask(dtype), masks.positions, self.cache,
                               last_only=False, logits_to_keep_ok=self._logits_to_keep_ok)
        logits = logits[:, :, : s.vocab_size].to(device=self.device, dtype=torch.float32)
        self.stats.target_calls += 1
        self.stats.target_time += self.clock() - t0
        return logits

    def _verify_tree(self, target_logits: Tensor, proposal: Proposal) -> tuple[Tensor, Tensor, Tensor]:
        """``(tokens [b, D+1], accepted_len [b], accepted_nodes [b, D+1])``."""
        s = self.settings
        t0 = self.clock()
        tree = proposal.tree
        rule = self._tree_rule(proposal)
        options = s.rule_options if rule == s.rule else {}
        result = verify_tree(target_logits.contiguous(), proposal.draft_logits, tree, rule=rule, sampling=s.sampling,
                             uniforms=self.view.uniforms(tree.batch_size, tree.max_nodes), **options)
        self.stats.tree_rule = rule
        self.stats.verify_time += self.clock() - t0
        return result.tokens, result.accepted_len, result.accepted_nodes

    def _count_tree(self, tree: TokenTree, accepted_h: Tensor, nodes_h: Tensor) -> None:
        """Acceptance by depth and by child rank (what Sequoia's shape is planned from)."""
        stats = self.stats
        parents, num, depth = (self.syncs.fetch(t) for t in (tree.parents, tree.num_nodes, tree.depth))
        N = parents.shape[1]
        index = torch.arange(N)
        real = index[None, :] < num[:, None]
        same = (parents[:, :, None] == parents[:, None, :]) & real[:, None, :] & (index[None, None, :] < index[None, :, None])
        rank = same.sum(2)  # rank of each node among its siblings
        children = ((parents[:, None, :] == index[None, :, None]) & real[:, None, :]).sum(2)  # [b, N]
        for row in range(parents.shape[0]):
            tau = int(accepted_h[row])
            path = nodes_h[row, : tau + 1].tolist()
            max_depth = int((depth[row] * real[row]).max())
            for d in range(max_depth):
                _bump(stats.position_drafted, d)
                if d < tau:
                    _bump(stats.position_accepted, d)
                else:
                    _grow(stats.position_accepted, d)
            for j in range(tau):
                r = int(rank[row, path[j + 1]])
                for q in range(r + 1):
                    _bump(stats.rank_tried, q)
                _bump(stats.rank_accepted, r)
            stop = path[-1]
            for q in range(int(children[row, stop])):
                _bump(stats.rank_tried, q)
            if int(children[row, stop]) > 0:
                stats.rejections += 1
            stats.drafted_tokens += int(num[row]) - 1
            stats.accepted_tokens += tau
        for lst in (stats.rank_tried, stats.rank_accepted):
            _grow(lst, max(len(stats.rank_tried), len(stats.rank_accepted)) - 1)
        observe = getattr(getattr(self.drafter, "tree", None), "observe", None)
        if observe is not None:
            observe(stats.rank_tried, stats.rank_accepted)

    # ------------------------------------------------------------------ one step
    def _step(self) -> bool:
        """One speculative step; False when every row has finished."""
        s, b, stats = self.settings, self.batch, self.stats
        gamma, remaining = self._plan()
        self.processors.start_step()
        proposal = self._propose(gamma) if gamma > 0 else None
        tree = proposal.tree if proposal is not None else None
        nodes = None
        if tree is not None:
            target_logits = self._score_tree(tree)
            tokens, accepted_len, nodes = self._verify_tree(target_logits, proposal)
            k = int(tokens.shape[1]) - 1
            verified = torch.zeros_like(accepted_len)
        else:
            k = 0 if proposal is None else proposal.num_tokens
            if k:
                b.write_draft(proposal.draft_tokens, proposal.num_draft_tokens)
            target_logits = self._score(proposal.draft_tokens if k else None)
            tokens, accepted_len, verified = self._verify(target_logits, proposal, remaining)

        t0 = self.clock()
        keep, finished = self._emit(tokens, accepted_len, remaining)
        host = self.syncs.fetch(torch.stack([accepted_len, keep, finished.long(), verified]))
        accepted_h, keep_h, finished_h, verified_h = host[0], host[1], host[2].bool(), host[3]
        if tree is not None:
            self._count(0, accepted_h, keep_h, verified_h)
            self._count_tree(tree, accepted_h, self.syncs.fetch(nodes))
        else:
            self._count(k, accepted_h, keep_h, verified_h)
        if s.streamer is not None:
            s.streamer.put(self.syncs.fetch(tokens[0, : int(keep_h[0])]))
        continuing = ~finished_h
        if not bool(continuing.any()):
            stats.bookkeeping_time += self.clock() - t0
            return False

        # roll back: rejected drafts become holes, caches keep the committed columns
        ta = self.clock()
        max_accepted = int(accepted_h[continuing].max())
        next_tokens = tokens.gather(1, accepted_len[:, None])[:, 0]
        p = b.pending
        if tree is not None:  # the accepted path moves next to the prefix: a per-row column gather
            path = tokens[:, :max_accepted].clamp_min(0)
            b.write_draft(path, None)
            if max_accepted:
                order = p + nodes[:, 1: max_accepted + 1].clamp_min(0)
                kv_cache.gather_columns(self.cache, order, start=p + 1)
            else:
                kv_cache.crop(self.cache, p + 1)
            pending = b.advance(accepted_len, next_tokens, max_accepted, max_accepted)
        else:
            pending = b.advance(accepted_len, next_tokens, k, max_accepted)
            kv_cache.crop(self.cache, pending)
        kept_rows = None
        if bool(finished_h.any()):
            kept_rows = torch.nonzero(continuing).flatten().to(self.device)
            b.keep_rows(kept_rows, [self.cache])
        order = self._repack()
        self.drafter.commit(CommitUpdate(accepted_len=accepted_len, num_columns=pending + 1, kept_rows=kept_rows,
                                         column_order=order, accepted_nodes=nodes))
        stats.alignment_time += self.clock() - ta
        if k and tree is None:
            s.schedule.update(num_draft_tokens=k, drafted=verified_h, accepted=accepted_h, stats=stats)
        stats.bookkeeping_time += self.clock() - t0
        return True


def _grow(values: list[int], index: int) -> None:
    while len(values) <= index:
        values.append(0)


def _bump(values: list[int], index: int) -> None:
    _grow(values, index)
    values[index] += 1


def run_engine(target: torch.nn.Module, drafter: Drafter, input_ids: Tensor, attention_mask: Tensor | None,
               settings: EngineSettings, stats: SpeculativeStats | None = None, *,
               start_time: float | None = None) -> tuple[Tensor, SpeculativeStats]:
    """Generate with a fresh :class:`SpeculativeEngine`; returns ``(sequences, stats)``.
    ``stats.total_time`` counts from ``start_time`` (a ``time.perf_counter()`` value taken
    when the caller started checking its arguments), or from now."""
    if stats is not None and not isinstance(stats, SpeculativeStats):
        raise TypeError(f"stats: expected a SpeculativeStats or None, got {type(stats).__name__}")
    engine = SpeculativeEngine(target, drafter, settings, stats)
    start = time.perf_counter() if start_time is None else start_time
    sequences = engine.generate(input_ids, attention_mask)
    engine.stats.total_time = engine.clock() - start
    return sequences, engine.stats
