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
   A drafter that declares ``feature_layers`` is also handed the target's hidden states of the
   committed columns, taken from the same target forward (and the prompt's after the prefill).

The batch layout is described in :mod:`specdecode.engine.batch`. What this loop shares with the
static path (:mod:`specdecode.engine.static_loop`) is in :mod:`~specdecode.engine.step_phases`
(scored logits, chain verification), :mod:`~specdecode.engine.stopping` (EOS and length cuts) and
:mod:`~specdecode.engine.accounting` (statistics).
"""

from __future__ import annotations

import torch
from torch import Tensor

from specdecode.drafters.base import CommitUpdate, Drafter, Proposal, SideTokens, check_proposal
from specdecode.engine.accounting import (add_step_counters, count_prefill, count_syncs, count_tree_step, label_run,
                                          name_of, record_accepted_lengths, step_counters, timed_run)
from specdecode.engine.batch import BatchState
from specdecode.engine.draft_view import DraftView
from specdecode.engine.processors import ProcessorRunner
from specdecode.engine.replay import common_acceptance
from specdecode.engine.settings import EngineSettings
from specdecode.engine.side_tokens import with_side_tokens
from specdecode.engine.stats import Clock, SpeculativeStats
from specdecode.engine.step_phases import scored_logits, tree_rule_for, verify_chain
from specdecode.engine.stopping import emitted_lengths, finished_rows, output_columns, verify_budget
from specdecode.engine.syncs import HostSyncs
from specdecode.models import facts, kv_cache
from specdecode.rules import get_rule, is_chain_rule
from specdecode.sampling import sample_logits
from specdecode.trees import TokenTree, tree_attention_mask, verify_tree


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
        # A drafter that cannot attend over more cache columns (the target's own sliding-window
        # layers are masked per layer type in every forward: specdecode.models.layer_masks).
        self.window = getattr(drafter, "max_columns", None)
        # The target's hidden states the drafter reads (None: it reads none and none are asked for).
        layers = getattr(drafter, "feature_layers", None)
        self.feature_layers = None if layers is None else facts.check_feature_layers(
            target, layers, f"{type(drafter).__name__}.feature_layers")
        self._features: Tensor | None = None  # the last target forward's, when feature_layers is set
        self._prompt_unscored = False  # the prefill waits to be fused with the first chain step

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
                f"drafter's max_columns ({self.window}); the drafter cannot attend over more cache columns"
            )
        devices = [self.device] + [d for d in (getattr(self.drafter, "device", None),) if isinstance(d, torch.device)]
        self.syncs = HostSyncs()
        self.clock = Clock(*devices, syncs=self.syncs)
        self.batch = BatchState(input_ids, attention_mask, device=self.device, max_new_tokens=s.max_new_tokens,
                                pad_id=s.pad_id, max_step_columns=s.schedule.maximum, syncs=self.syncs)
        self.processors = ProcessorRunner(self.batch, s.processors, s.stopping, s.pad_id, self.syncs)
        self.view = DraftView(self.batch, s, self.processors, self.clock)
        self.cache = kv_cache.new_cache(self.target)
        self._replays = kv_cache.replays(self.cache)  # recurrent states: rolled back by replaying (engine/replay.py)
        facts.check_decoder_forward(self.target)
        self._saved: list = []
        self.eos = torch.tensor(s.eos_ids, dtype=torch.long, device=self.device) if s.eos_ids else None
        self.drafter.reset()
        label_run(stats, rule=self.rule.name if self.rule is not None else (s.rule or "token"), drafter=self.drafter,
                  batch_size=self.batch.batch, schedule=name_of(s.schedule), decode_path="eager", settings=s)
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
            count_syncs(stats, self.syncs)
        return self.batch.sequences[:, : self.batch.prompt_len + new]

    # ------------------------------------------------------------------ phases
    def _prefill(self) -> None:
        """The target's forward over the prompt before the pending token. Deferred when it can
        be fused with the first verification (``self._prompt_unscored``): a drafter that reads
        no target features drafts from the prompt alone, so a first chain step scores the
        prompt and the draft in one forward (as Hugging Face's assisted generation does), one
        target call fewer; a first tree step runs it on its own first."""
        b = self.batch
        self._prompt_unscored = False
        if b.pending == 0:
            return
        if self.feature_layers is None and self._logits_to_keep_ok and self.window is None and not self._replays:
            self._prompt_unscored = True
            return
        self._run_prefill()

    def _run_prefill(self) -> None:
        b = self.batch
        self._prompt_unscored = False
        t0 = self.clock()
        self._target_forward(b.tokens[:, : b.pending], b.attention(b.pending), b.positions[:, : b.pending], True)
        count_prefill(self.stats, self.clock() - t0)
        if self._features is not None:
            zeros = torch.zeros(b.num_active, dtype=torch.long, device=self.device)
            self.drafter.commit(CommitUpdate(accepted_len=zeros, num_columns=b.pending + 1, features=self._features))

    def _target_forward(self, ids: Tensor, mask: Tensor | None, positions: Tensor, last_only: bool) -> Tensor:
        """One target forward appending to the cache; keeps its features when the drafter asks."""
        if self.feature_layers is None:
            return facts.forward(self.target, ids, mask, positions, self.cache, last_only=last_only,
                                 logits_to_keep_ok=self._logits_to_keep_ok)
        logits, self._features = facts.forward_with_features(
            self.target, ids, mask, positions, self.cache, layers=self.feature_layers, last_only=last_only,
            logits_to_keep_ok=self._logits_to_keep_ok)
        return logits

    def _committed_features(self, tree: TokenTree | None, nodes: Tensor | None, max_accepted: int
                            ) -> Tensor | None:
        """The step's target features at the committed columns ``pending .. pending +
        max_accepted`` (trees: gathered along each row's accepted path), for the drafter."""
        h = self._features
        if h is None:
            return None
        if tree is None:
            return h[:, : max_accepted + 1]
        index = nodes[:, : max_accepted + 1].clamp_min(0).to(h.device)
        return h.gather(1, index[:, :, None].expand(-1, -1, h.shape[-1]))

    def _plan(self) -> tuple[int, Tensor]:
        """Draft tokens for this step and each row's remaining budget ``[b]``."""
        b, s = self.batch, self.settings
        remaining = s.max_new_tokens - b.generated[b.rows]
        remaining_max = self.syncs.integer(remaining.max())
        planned = s.schedule.plan(batch_size=b.num_active, stats=self.stats)
        self.stats.planned_num_draft_tokens.append(int(planned))
        gamma = max(min(planned, remaining_max - 1), 0)  # 0: a plain target step
        return self._fit_window(gamma), remaining

    def _fit_window(self, gamma: int) -> int:
        """A drafter with ``max_columns`` sees that many cache columns at most: when a step would pass
        it, re-pack the rows, then draft fewer tokens; refuse only when not even the pending
        token fits (the prompt + max_new_tokens check up front makes that unlikely)."""
        b = self.batch
        if self.window is None or b.pending + gamma + 1 <= self.window:
            return gamma
        self._forced_repack()
        if b.pending + 1 > self.window:
            raise RuntimeError(
                f"the batch needs {b.pending + 1} cache columns, more than the drafter's max_columns "
                f"({self.window})"
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
        if self._prompt_unscored:  # the prompt and the first draft in one forward
            logits = facts.forward(self.target, b.tokens[:, : p + k + 1], b.attention(p + k + 1),
                                   b.positions[:, : p + k + 1], self.cache, last_only=False,
                                   logits_to_keep_ok=self._logits_to_keep_ok, keep_last=k + 1)
        else:
            if self._replays and k:
                self._saved = kv_cache.checkpoint(self.cache)
            logits = self._target_forward(b.tokens[:, p: p + k + 1], b.attention(p + k + 1),
                                          b.positions[:, p: p + k + 1], False)
        logits = scored_logits(logits, s.vocab_size, self.device)
        if self.processors.processors is not None:
            logits = torch.stack([self.processors.process(logits[:, i], draft_tokens[:, :i] if k else None)
                                  for i in range(k + 1)], 1)
        self.stats.target_calls += 1
        self.stats.target_time += self.clock() - t0
        if self._prompt_unscored:  # this call was the prefill too: counted once in each
            self._prompt_unscored = False
            self.stats.target_prefill_calls += 1
            self.stats.target_prefill_time += self.clock() - t0
            self.stats.fused_prefills += 1
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
        verified = verify_budget(remaining, k)
        if proposal.num_draft_tokens is not None:
            verified = torch.minimum(verified, proposal.num_draft_tokens)
        if self.rule is None:
            raise ValueError(f"rule: {s.rule!r} is a tree rule, but the drafter proposed a chain; use a chain rule "
                             "(specdecode.list_rules()) or draft a tree")
        result = verify_chain(target_logits, proposal.draft_tokens, proposal.draft_logits, verified, self.rule, s,
                              uniforms=self.view.uniforms(n, k + 1))
        if self.device.type == "cuda" and self.rule.builtin:
            self.syncs.count()  # the CUDA op copies its per-row statuses to the host to raise bad input
        self.stats.verify_time += self.clock() - t0
        return result.tokens.to(self.device), result.accepted_len.to(self.device), verified

    def _emit(self, tokens: Tensor, accepted_len: Tensor, remaining: Tensor) -> tuple[Tensor, Tensor]:
        """Write each row's new tokens to the outputs; returns kept counts and finished rows."""
        b, s = self.batch, self.settings
        idx = torch.arange(tokens.shape[1], device=self.device)
        keep, finished = emitted_lengths(tokens, accepted_len, remaining, self.eos, idx)
        generated = b.generated[b.rows]
        cols = output_columns(keep, b.prompt_len + generated, idx, b.width - 1)
        b.sequences[b.rows[:, None].expand_as(cols), cols] = tokens
        if self.processors.stopping is not None:
            keep, stopped = self.processors.check_stopping(keep)
            finished = finished | stopped
        b.generated[b.rows] = generated + keep
        return keep, finished_rows(finished, generated + keep, s.max_new_tokens)

    def _count(self, gamma: int, accepted_h: Tensor, keep_h: Tensor, verified_h: Tensor) -> None:
        """Add one step (host tensors) to the statistics; ``gamma`` 0 for plain and tree steps."""
        active = torch.ones(accepted_h.shape, dtype=torch.bool)
        counters = step_counters(active, accepted_h, verified_h, keep_h, torch.arange(gamma))
        add_step_counters(self.stats, counters.tolist(), gamma)
        self.stats.num_draft_tokens_history.append(gamma)
        record_accepted_lengths(self.stats, accepted_h.tolist())

    def _replay(self, pending: int, accepted: int) -> None:
        """Recurrent states: back to before the step's verification, then the pending token and
        the ``accepted`` drafts every row kept are fed again (engine/replay.py)."""
        b = self.batch
        t0 = self.clock()
        kv_cache.rewind(self.cache, self._saved, pending)
        end = pending + accepted + 1
        facts.forward(self.target, b.tokens[:, pending:end], b.attention(end), b.positions[:, pending:end],
                      self.cache, last_only=True, logits_to_keep_ok=self._logits_to_keep_ok)
        self.stats.target_calls += 1
        self.stats.target_time += self.clock() - t0

    def _repack(self, force: bool = False) -> Tensor | None:
        order = self.batch.repack_order(force)
        if order is not None:
            self.batch.repack(order, self.cache)
            self.stats.repacks += 1
        return order

    def _forced_repack(self) -> None:
        """Re-pack before a step (a drafter's ``max_columns``) and tell the drafter; nothing was accepted."""
        pending = self.batch.pending
        order = self._repack(force=True)
        if order is not None:
            accepted = torch.zeros(self.batch.num_active, dtype=torch.long, device=self.device)
            self.drafter.commit(CommitUpdate(accepted_len=accepted, num_columns=pending + 1, column_order=order))

    # ------------------------------------------------------------------ trees
    def _tree_rule(self, proposal: Proposal) -> str:
        """The tree rule for a proposal: the one asked for, if it is lossless for (or does not
        care about) the proposal's children scheme; else the scheme's own lossless rule."""
        return tree_rule_for(self.settings.rule, proposal.children or "deterministic")

    def _score_tree(self, tree: TokenTree, side: SideTokens | None) -> tuple[Tensor, Tensor | None]:
        """Target logits ``[b, N, V]`` at every node of ``tree`` (root = pending token), one
        forward with the tree attention mask and positions; and ``[b, S, V]`` at the
        drafter's side tokens (None without)."""
        b, s = self.batch, self.settings
        if self.processors.processors is not None:
            raise ValueError("logits_processor: Hugging Face logits processors are not supported with token trees "
                             "(each node has its own context); draft a chain (tree=None) to use them")
        if not self._tree_checked:
            facts.check_tree_attention(self.target, "target")
            self._tree_checked = True
        t0 = self.clock()
        p = b.pending
        num_side = 0 if side is None else side.tokens.shape[1]
        b.ensure_capacity(p + tree.max_nodes + num_side + 2)
        masks = tree_attention_mask(tree, b.mask[:, :p], b.positions[:, p])
        dtype = getattr(self.target, "dtype", torch.float32)
        if side is None:
            tokens, mask, positions = tree.tokens, masks.additive_mask(dtype), masks.positions
        else:
            tokens, bool_mask, positions = with_side_tokens(tree.tokens, masks, side)
            mask = masks._replace(attention_mask=bool_mask).additive_mask(dtype)
        logits = self._target_forward(tokens, mask, positions, False)
        logits = scored_logits(logits, s.vocab_size, self.device)
        self.stats.target_calls += 1
        self.stats.target_time += self.clock() - t0
        if side is None:
            return logits, None
        return logits[:, : tree.tokens.shape[1]], logits[:, tree.tokens.shape[1]:]

    def _is_path(self, tree: TokenTree) -> bool:
        """True when every row's tree is a single path (node ``i``'s parent is ``i - 1``), so
        the chain scoring gives the same logits at its nodes as the tree mask would."""
        parents, n = tree.parents[:, 1:], tree.parents.shape[1]
        if n < 2:
            return False
        slot = torch.arange(1, n, device=parents.device)[None, :]
        return self.syncs.flag(((parents == slot - 1) | (slot >= tree.num_nodes[:, None])).all())

    def _verify_tree(self, target_logits: Tensor, proposal: Proposal) -> tuple[Tensor, Tensor, Tensor]:
        """``(tokens [b, D+1], accepted_len [b], accepted_nodes [b, D+1])``."""
        s = self.settings
        t0 = self.clock()
        tree = proposal.tree
        rule = self._tree_rule(proposal)
        options = s.rule_options if rule == s.rule else {}
        result = verify_tree(target_logits, proposal.draft_logits, tree, rule=rule, sampling=s.sampling,
                             uniforms=self.view.uniforms(tree.batch_size, tree.max_nodes), **options)
        self.stats.tree_rule = rule
        self.stats.verify_time += self.clock() - t0
        return result.tokens, result.accepted_len, result.accepted_nodes

    # ------------------------------------------------------------------ one step
    def _step(self) -> bool:
        """One speculative step; False when every row has finished."""
        s, b, stats = self.settings, self.batch, self.stats
        gamma, remaining = self._plan()
        self.processors.start_step()
        proposal = self._propose(gamma) if gamma > 0 else None
        tree = proposal.tree if proposal is not None else None
        nodes = side_logits = None
        if tree is not None:
            if self._replays:
                raise ValueError(f"tree: {type(self.target).__name__} ({self.target.config.model_type}) has recurrent "
                                 "layers, whose state the eager path cannot hold for a tree's branches; draft a chain "
                                 "(tree=None), or use decode_path='static', which steps each node from its parent")
            if proposal.side is None and self.processors.processors is None and self._is_path(tree):
                # every row's tree is one path: score it as a chain (a plain mask; the prompt's
                # forward when it is still unscored), verify it with the tree rule
                b.write_draft(tree.tokens[:, 1:], None)
                target_logits = self._score(tree.tokens[:, 1:])
            else:
                if self._prompt_unscored:
                    self._run_prefill()
                target_logits, side_logits = self._score_tree(tree, proposal.side)
            tokens, accepted_len, nodes = self._verify_tree(target_logits, proposal)
            k = int(tokens.shape[1]) - 1
            verified = torch.zeros_like(accepted_len)
        else:
            k = 0 if proposal is None else proposal.num_tokens
            stats.plain_steps += not k
            if k:
                b.write_draft(proposal.draft_tokens, proposal.num_draft_tokens)
            else:  # a plain step: room for the next pending token
                b.ensure_capacity(b.pending + 2)
            target_logits = self._score(proposal.draft_tokens if k else None)
            tokens, accepted_len, verified = self._verify(target_logits, proposal, remaining)
            if self._replays and k:
                common = self.syncs.integer(accepted_len.min())
                coins = None if s.sampling.is_greedy else self.view.uniforms(b.num_active)
                tokens, accepted_len = common_acceptance(tokens, accepted_len, common, target_logits, s.sampling,
                                                         coins)

        t0 = self.clock()
        keep, finished = self._emit(tokens, accepted_len, remaining)
        host = self.syncs.fetch(torch.stack([accepted_len, keep, finished.long(), verified]))
        accepted_h, keep_h, finished_h, verified_h = host[0], host[1], host[2].bool(), host[3]
        if tree is not None:
            self._count(0, accepted_h, keep_h, verified_h)
            count_tree_step(stats, tree, accepted_h, self.syncs.fetch(nodes), self.syncs)
            observe = getattr(getattr(self.drafter, "tree", None), "observe", None)
            if observe is not None:  # a tree shape planned from the acceptance so far
                observe(stats.rank_tried, stats.rank_accepted)
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
        features = self._committed_features(tree, nodes, max_accepted)
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
            if self._replays and k and max_accepted < k:
                self._replay(p, max_accepted)
            kv_cache.crop(self.cache, pending)
        kept_rows = None
        if bool(finished_h.any()):
            kept_rows = torch.nonzero(continuing).flatten().to(self.device)
            b.keep_rows(kept_rows, [self.cache])
        order = self._repack()
        self.drafter.commit(CommitUpdate(accepted_len=accepted_len, num_columns=pending + 1, kept_rows=kept_rows,
                                         column_order=order, accepted_nodes=nodes, target_logits=target_logits,
                                         side_logits=side_logits, features=features))
        stats.alignment_time += self.clock() - ta
        if tree is None:  # plain steps too: a schedule may time them
            s.schedule.update(num_draft_tokens=k, drafted=verified_h, accepted=accepted_h, stats=stats)
        stats.bookkeeping_time += self.clock() - t0
        return True


def run_engine(target: torch.nn.Module, drafter: Drafter, input_ids: Tensor, attention_mask: Tensor | None,
               settings: EngineSettings, stats: SpeculativeStats | None = None, *,
               start_time: float | None = None) -> tuple[Tensor, SpeculativeStats]:
    """Generate with a fresh :class:`SpeculativeEngine`; returns ``(sequences, stats)``
    (:func:`~specdecode.engine.accounting.timed_run` says how ``stats.total_time`` counts)."""
    return timed_run(lambda: SpeculativeEngine(target, drafter, settings, stats), input_ids, attention_mask, stats,
                     start_time)
