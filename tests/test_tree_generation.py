"""Token-tree generation through the engine: greedy trees reproduce the target's greedy output on
several architectures (batch 1 and left-padded batches), sampled trees keep the target's law
(whole-loop exact test for specinfer, rrs and deterministic children, with broken builders that
must fail), the caches after a tree step equal a plain forward, and misuse is refused."""

from __future__ import annotations

import copy

import pytest
import torch
from test_generate_models import PAD, _one_thread, left_padded, make_pair  # noqa: F401
from test_generate_sampling import K, PROMPT, chi_square_p, exact_joint
from test_generate_sampling import pair as sampling_pair  # noqa: F401

import specdecode
import specdecode.engine.loop as engine_loop
from specdecode import ModelDrafter
from specdecode.models import facts, kv_cache
from specdecode.trees.builders import BuiltTree, DynamicTree, StaticTree

PASS_P, FAIL_P = 1e-4, 1e-6
N_SAMPLES = 20000


def hf_greedy(target, ids, mask=None, max_new_tokens=20):
    mask = torch.ones_like(ids) if mask is None else mask
    return target.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                           pad_token_id=PAD)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2", "opt", "gpt_neox"])
def test_greedy_tree_generation_equals_target(arch):
    target, draft = make_pair(arch)
    ids, mask = left_padded([5, 9, 2, 7], seed=1)
    ref = hf_greedy(target, ids, mask)
    ref1 = hf_greedy(target, ids[1:2])
    for tree in ("dynamic", "static", "sequoia"):
        out = specdecode.generate(target, draft, ids, mask, tree=tree, num_nodes=8, max_new_tokens=20)
        assert torch.equal(out.sequences, ref), (arch, tree)
        assert out.stats.accepted_tokens > 0
        one = specdecode.generate(target, draft, ids[1:2], tree=tree, num_nodes=6, max_new_tokens=20)
        assert torch.equal(one.sequences, ref1), (arch, tree)
    seq = target.generate(ids, attention_mask=mask, custom_generate=specdecode.custom_generate, draft_model=draft,
                          tree="dynamic", num_nodes=8, max_new_tokens=20, do_sample=False, pad_token_id=PAD)
    assert torch.equal(seq, ref)


def test_tree_steps_leave_caches_equal_to_a_plain_forward(monkeypatch):
    """After every tree step, the target cache gives the pending token the same logits as a
    plain forward over each row's committed tokens."""
    target, draft = make_pair("llama")
    ids, mask = left_padded([6, 3, 8], seed=2)
    original = engine_loop.SpeculativeEngine._step
    checked = []

    def step(self):
        going = original(self)
        if going:
            b = self.batch
            p = b.pending
            cache = copy.deepcopy(self.cache)
            logits = facts.forward(self.target, b.tokens[:, p: p + 1], b.mask[:, : p + 1], b.positions[:, p: p + 1],
                                   cache, last_only=True, logits_to_keep_ok=False)
            for r, context in enumerate(b.contexts()):
                plain = self.target(context[None]).logits[0, -1]
                assert float((plain - logits[r]).abs().max()) < 1e-4
            checked.append(p)
        return going

    monkeypatch.setattr(engine_loop.SpeculativeEngine, "_step", step)
    specdecode.generate(target, draft, ids, mask, tree="dynamic", num_nodes=10, max_new_tokens=16)
    specdecode.generate(target, draft, ids, mask, tree="sequoia", num_nodes=7, max_new_tokens=16, do_sample=True,
                        generator=torch.Generator().manual_seed(1))
    assert len(checked) >= 4
    assert kv_cache  # (the cache operations under test)


def _sample(target, draft, **kwargs):
    ids = torch.tensor([PROMPT]).expand(N_SAMPLES, -1)
    return specdecode.generate(target, draft, ids, do_sample=True, max_new_tokens=K, eos_token_id=[],
                               pad_token_id=PAD, generator=torch.Generator().manual_seed(0), **kwargs)


@pytest.mark.parametrize("children, rule", [("iid", "specinfer"), ("without_replacement", "rrs"),
                                            ("deterministic", "deterministic")])
def test_sampled_tree_generation_is_lossless(sampling_pair, children, rule):
    target, draft = sampling_pair
    joint = exact_joint(target, PROMPT)
    out = _sample(target, draft, tree=[[0], [1], [0, 0], [0, 1], [1, 0]], tree_children=children)
    assert out.stats.tree_rule == rule
    assert out.stats.rank_accepted[1] > 0  # second children really get accepted
    assert chi_square_p(out.sequences[:, len(PROMPT):], joint) > PASS_P


class RerankedSampledTree(StaticTree):
    """Broken (token-trees §4): draw 3 children i.i.d., keep the 2 the draft likes best, and
    claim they are i.i.d. draws."""

    def build(self, root_tokens, root_logits, expand, sampling, coins):
        wide = StaticTree([[0], [1], [2]], children="iid").build(root_tokens, root_logits, expand, sampling, coins)
        q = torch.softmax(root_logits, -1)
        kids = wide.tree.tokens[:, 1:]
        best = torch.sort(q.gather(1, kids), dim=1, descending=True, stable=True).indices[:, :2]
        tokens = torch.cat([root_tokens[:, None], kids.gather(1, best)], 1)
        tree = specdecode.TokenTree(tokens, wide.tree.parents[:, :3].contiguous(), wide.tree.num_nodes.clamp_max(3))
        return BuiltTree(tree, wide.draft_logits[:, :3].contiguous(), "iid", wide.forward_calls)


class WrongNodeQTree(StaticTree):
    """Broken: children drawn without replacement at every node, but verification is handed
    the root's q at every node."""

    def build(self, root_tokens, root_logits, expand, sampling, coins):
        built = super().build(root_tokens, root_logits, expand, sampling, coins)
        built.draft_logits = built.draft_logits[:, :1].expand_as(built.draft_logits).contiguous()
        return built


@pytest.mark.parametrize("broken", ["rerank", "wrong_q"])
def test_broken_tree_drafting_fails_the_same_test(sampling_pair, broken):
    target, draft = sampling_pair
    joint = exact_joint(target, PROMPT)
    if broken == "rerank":
        drafter = ModelDrafter(draft, tree=RerankedSampledTree([[0], [1]], children="iid"))
    else:
        drafter = ModelDrafter(draft, tree=WrongNodeQTree([[0], [1], [0, 0], [1, 0]], children="without_replacement"))
    out = _sample(target, drafter)
    assert chi_square_p(out.sequences[:, len(PROMPT):], joint) < FAIL_P


def test_tree_misuse_is_refused():
    target, draft = make_pair("llama")
    ids = left_padded([4], seed=3)[0]
    with pytest.raises(ValueError, match="lossless only for children drafted iid"):
        specdecode.generate(target, draft, ids, tree="dynamic", rule="specinfer", do_sample=True, max_new_tokens=4)
    with pytest.raises(ValueError, match="chain rule"):
        specdecode.generate(target, draft, ids, tree="dynamic", rule="block", max_new_tokens=4)
    with pytest.raises(ValueError, match="tree rule"):
        specdecode.generate(target, draft, ids, rule="rrs", max_new_tokens=4)
    with pytest.raises(ValueError, match="children"):
        specdecode.generate(target, draft, ids, tree="dynamic", tree_children="hub", max_new_tokens=4)
    from specdecode.drafters import DrafterBase

    class ChainsOnly(DrafterBase):  # no tree attribute, no with_tree
        pass

    with pytest.raises(ValueError, match="^tree: ChainsOnly drafts chains only"):
        specdecode.generate(target, ChainsOnly(), ids, tree="dynamic", max_new_tokens=4)
    assert specdecode.generate(target, ModelDrafter(draft), ids, tree="dynamic", max_new_tokens=4).stats.tree_rule
    with pytest.raises(ValueError, match="num_nodes"):
        specdecode.generate(target, draft, ids, tree="dynamic", num_nodes=1, max_new_tokens=4)
    from transformers import LogitsProcessorList, RepetitionPenaltyLogitsProcessor

    with pytest.raises(ValueError, match="logits_processor"):
        specdecode.generate(target, draft, ids, tree="dynamic", max_new_tokens=4,
                            logits_processor=LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.2)]))


def test_model_ignoring_custom_masks_is_refused():
    from transformers import LlamaForCausalLM

    target, draft = make_pair("llama")

    class IgnoresMasks(LlamaForCausalLM):
        def forward(self, *args, **kwargs):
            kwargs["attention_mask"] = None
            return super().forward(*args, **kwargs)

    blind = IgnoresMasks(target.config).eval()
    blind.load_state_dict(target.state_dict())
    ids = left_padded([4], seed=4)[0]
    with pytest.raises(ValueError, match="custom 4D attention mask"):
        specdecode.generate(blind, draft, ids, tree="dynamic", max_new_tokens=4)
    specdecode.generate(blind, draft, ids, max_new_tokens=4)  # chains do not need it


def test_acceptance_by_rank_feeds_sequoia():
    target, draft = make_pair("gpt2")
    ids, mask = left_padded([5, 7], seed=5)
    out = specdecode.generate(target, draft, ids, mask, tree=DynamicTree(num_nodes=8, max_depth=3), max_new_tokens=24)
    rates = out.stats.acceptance_by_rank
    assert rates and all(0.0 <= r <= 1.0 for r in rates)
    assert sum(out.stats.rank_accepted) == out.stats.accepted_tokens
    shape, value = specdecode.trees.sequoia_shape(specdecode.trees.acceptance_from_conditional(rates), 8, 4)
    assert shape.num_nodes <= 8 and value >= 0
