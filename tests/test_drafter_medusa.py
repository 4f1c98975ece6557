"""MedusaDrafter: greedy output is the target's own (three architectures, chains and trees,
batch 1 and left-padded batches), the feature each proposal reads is the target's last hidden
state at the row's last committed token (through rejections, re-packs and finished rows) and
head ``i`` drafts position ``i + 1``, sampling stays lossless for the sampled chain and the
deterministic tree, broken variants fail the same test, tree helpers and bad arguments."""

from __future__ import annotations

import pytest
import torch
from test_drafters import hf_greedy
from test_generate_models import INIT, PAD, _one_thread, left_padded, make_model  # noqa: F401
from test_generate_sampling import K, N, PROMPT, chi_square_p, exact_joint
from test_generate_sampling import pair as sampling_pair  # noqa: F401

import specdecode
from specdecode.drafters.medusa import MedusaDrafter, MedusaHeads, check_choices, product_tree, sparse_tree

PASS_P, FAIL_P = 1e-4, 1e-6


def target_model(arch: str, seed: int = 0, vocab: int = 111):
    return make_model(arch, seed=seed, vocab=vocab, layers=3, init=INIT.get(arch, 0.02))


def random_heads(target, num_heads: int = 3, std: float = 0.3, seed: int = 0) -> MedusaHeads:
    heads = MedusaHeads(target, num_heads)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        heads.weight.copy_(torch.randn(heads.weight.shape, generator=g) * std)
        heads.bias.copy_(torch.randn(heads.bias.shape, generator=g) * std)
    return heads.eval()


@pytest.mark.parametrize("shape", ["chain", "tree"])
@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_greedy_equals_target_greedy(arch, shape):
    target = target_model(arch)
    tree = product_tree([3, 2, 1]) if shape == "tree" else None
    assert_greedy_is_the_targets(target, MedusaDrafter(target, random_heads(target), tree=tree))


def assert_greedy_is_the_targets(target, drafter) -> None:
    """Greedy output with ``drafter`` equals the target's own, at batch 1 and on a left-padded
    batch of 3 (3 drafts per step, 16 new tokens)."""
    one = left_padded([7], vocab=111, seed=2)[0]
    ids, mask = left_padded([5, 9, 2], vocab=111, seed=3)
    out_one = specdecode.generate(target, drafter, one, num_draft_tokens=3, max_new_tokens=16)
    assert torch.equal(out_one.sequences, hf_greedy(target, one, max_new_tokens=16))
    out = specdecode.generate(target, drafter, ids, mask, num_draft_tokens=3, max_new_tokens=16)
    assert torch.equal(out.sequences, hf_greedy(target, ids, mask, max_new_tokens=16))
    assert out.stats.drafter == drafter.name and out.stats.draft_calls > 0


class FeatureCheck:
    """Before each proposal: the feature kept for every row is the last hidden state of a plain
    forward over the row's context at its last committed token (the one before the pending).
    Mixed into a drafter class (Medusa's, Hydra's); counts the rows checked in ``checked``."""

    checked = 0

    def propose(self, state, num_tokens):
        with torch.no_grad():
            for r, context in enumerate(state.contexts()):
                if len(context) < 2:
                    continue
                hidden = self.target(context[None], output_hidden_states=True).hidden_states[-1]
                torch.testing.assert_close(self.last_feature[r], hidden[0, -2], rtol=1e-4, atol=1e-4)
                type(self).checked += 1
        return super().propose(state, num_tokens)


class Checking(FeatureCheck, MedusaDrafter):
    pass


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_features_are_the_last_committed_tokens(shape, monkeypatch):
    import specdecode.engine.batch as layout

    monkeypatch.setattr(layout, "REPACK_MIN_WASTE", 2)  # re-pack often
    monkeypatch.setattr(layout, "REPACK_MIN_FRACTION", 0.05)
    target = target_model("llama", seed=1)
    Checking.checked = 0
    tree = product_tree([2, 2, 1]) if shape == "tree" else None
    ids, mask = left_padded([5, 9, 1], vocab=111, seed=4)
    want = target.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False, eos_token_id=[7],
                           pad_token_id=PAD)
    sequences = [row[m.bool()] for row, m in zip(want, torch.cat([mask, torch.ones_like(want[:, mask.shape[1]:])], 1))]
    heads = Ahead(target, 3, sequences, wrong_every=3)
    drafter = Checking(target, heads, tree=tree)
    out = specdecode.generate(target, drafter, ids, mask, num_draft_tokens=3, max_new_tokens=24, eos_token_id=[7],
                              pad_token_id=PAD)
    assert torch.equal(out.sequences, want)
    assert Checking.checked > 10 and out.stats.accepted_tokens > 10
    if shape == "chain":
        assert out.stats.repacks > 0 and 0.3 < out.stats.acceptance_rate < 1.0


class Ahead(MedusaHeads):
    """Exact heads for known greedy continuations: head ``i`` maps ``f_t`` to ``f_{t+1+i}``
    (``t`` and the sequence found as the nearest true feature), so the target's head on it
    gives ``y_{t+2+i}``. ``wrong_every``: head 1 and later are instead off by one position at
    every ``wrong_every``-th ``t`` (rows then accept different lengths)."""

    def __init__(self, target, num_heads: int, sequences: torch.Tensor, wrong_every: int = 0) -> None:
        super().__init__(target, num_heads)
        with torch.no_grad():
            self.tables = [target(row[None], output_hidden_states=True).hidden_states[-1][0] for row in sequences]
        self.wrong_every = wrong_every

    def forward(self, features):
        rows = []
        for f in features.reshape(-1, features.shape[-1]):
            distance, t, table = min(((tab - f).norm(dim=-1).min(0) + (tab,) for tab in self.tables),
                                     key=lambda x: float(x[0]))
            t = int(t)
            shifts = [1 + i + (1 if i and self.wrong_every and t % self.wrong_every == 0 else 0)
                      for i in range(self.num_heads)]
            rows.append(torch.stack([table[min(t + k, len(table) - 1)] for k in shifts]))
        return torch.stack(rows).reshape(*features.shape[:-1], self.num_heads, -1)


def test_head_i_drafts_position_i_plus_one():
    """Exact heads (head ``i`` turns the feature of ``y_t`` into that of ``y_{t+1+i}``) are
    accepted at every draft: the feature read is the last committed token's and head ``i``
    drafts position ``i + 1`` (the pending token being ``y_{t+1}``)."""
    target = target_model("qwen2", seed=3)
    ids = left_padded([6], vocab=111, seed=5)[0]
    want = hf_greedy(target, ids, max_new_tokens=12)
    drafter = MedusaDrafter(target, Ahead(target, 3, want).eval())
    out = specdecode.generate(target, drafter, ids, num_draft_tokens=3, max_new_tokens=12)
    assert torch.equal(out.sequences, want)
    assert out.stats.acceptance_rate == 1.0


def _sample(target, drafter, n: int = N, **sampling):
    ids = torch.tensor([PROMPT]).expand(n, -1)
    out = specdecode.generate(target, drafter, ids, num_draft_tokens=2, do_sample=True, max_new_tokens=K,
                              eos_token_id=[], pad_token_id=PAD, generator=torch.Generator().manual_seed(3), **sampling)
    assert out.sequences.shape == (n, len(PROMPT) + K)
    return out


@pytest.fixture(scope="module")
def joint(sampling_pair):
    return exact_joint(sampling_pair[0], PROMPT)


def test_sampled_chain_is_lossless(sampling_pair, joint):
    target, _ = sampling_pair
    out = _sample(target, MedusaDrafter(target, random_heads(target, 2, std=1.0, seed=1)))
    assert 0.05 < out.stats.acceptance_rate < 0.95
    assert chi_square_p(out.sequences[:, len(PROMPT):], joint) > PASS_P


def test_sampled_chain_is_lossless_with_temperature_and_top_k(sampling_pair):
    target, _ = sampling_pair
    joint = exact_joint(target, PROMPT, temperature=0.7, top_k=4)
    drafter = MedusaDrafter(target, random_heads(target, 2, std=1.0, seed=2))
    out = _sample(target, drafter, temperature=0.7, top_k=4)
    assert out.stats.accepted_tokens > 1000
    assert chi_square_p(out.sequences[:, len(PROMPT):], joint) > PASS_P


def test_tree_is_lossless(sampling_pair, joint):
    target, _ = sampling_pair
    out = _sample(target, MedusaDrafter(target, random_heads(target, 2, std=1.0, seed=1), tree=product_tree([3, 2])))
    assert out.stats.tree_rule == "deterministic" and out.stats.rank_accepted[1] > 100
    assert chi_square_p(out.sequences[:, len(PROMPT):], joint) > PASS_P


class SwappedLogits(MedusaDrafter):
    """Broken: hands over the heads' logits in the wrong order (draft i verified against head
    i + 1's distribution): an off-by-one between tokens and q."""

    def propose(self, state, num_tokens):
        proposal = super().propose(state, num_tokens)
        proposal.draft_logits = proposal.draft_logits.flip(1)
        return proposal


class ClaimsIid(MedusaDrafter):
    """Broken: the top-k tree verified as if each node's children were i.i.d. draws from its
    head's distribution (the engine then picks SpecInfer's rule)."""

    def propose(self, state, num_tokens):
        proposal = super().propose(state, num_tokens)
        b, n = proposal.draft_tokens.shape
        logits = self._head_logits(state)
        depth = torch.zeros(n, dtype=torch.long)
        for j in range(1, n):
            depth[j] = depth[int(proposal.tree.parents[0, j])] + 1
        head = depth.clamp_max(logits.shape[1] - 1)  # node j's children come from head depth(j)
        proposal.draft_logits = logits[:, head]
        proposal.children = "iid"
        return proposal


@pytest.mark.parametrize("broken", ["swapped", "iid"])
def test_broken_variants_fail_the_same_test(sampling_pair, joint, broken):
    target, _ = sampling_pair
    heads = random_heads(target, 2, std=1.0, seed=1)
    if broken == "swapped":
        drafter = SwappedLogits(target, heads)
    else:
        drafter = ClaimsIid(target, heads, tree=product_tree([3, 2]))
    out = _sample(target, drafter, n=8000)
    assert chi_square_p(out.sequences[:, len(PROMPT):], joint) < FAIL_P


def test_tree_helpers():
    assert product_tree([2, 1]) == [(0,), (1,), (0, 0), (1, 0)]
    assert check_choices([(1,), (0, 0), (0,)]) == [(0,), (1,), (0, 0)]
    acc = torch.tensor([[0.6, 0.2, 0.15], [0.5, 0.1, 0.05]])
    # best first: 0.6, 0.3 = 0.6 * 0.5, 0.2, 0.15 (before 0.1 = 0.2 * 0.5)
    assert sparse_tree(acc, 4) == [(0,), (0, 0), (1,), (2,)]
    assert all(p[:-1] in set(sparse_tree(acc, 6)) or len(p) == 1 for p in sparse_tree(acc, 6))
    for bad in ([], [(0, 0)], [(0,), (0,)], [(-1,)], "0"):
        with pytest.raises(ValueError, match="tree"):
            check_choices(bad)
    with pytest.raises(ValueError, match="deeper"):
        check_choices([(0,), (0, 0), (0, 0, 0)], num_heads=2)
    with pytest.raises(ValueError, match="widths"):
        product_tree([2, 0])
    with pytest.raises(ValueError, match="accuracies"):
        sparse_tree(torch.tensor([1.5]), 3)
    with pytest.raises(ValueError, match="num_nodes"):
        sparse_tree(acc, 0)


def test_bad_arguments_are_refused():
    target = target_model("llama")
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="num_heads"):
            MedusaHeads(target, bad)
    assert_drafter_refuses_bad_arguments(target, MedusaHeads, MedusaDrafter)


def assert_drafter_refuses_bad_arguments(target, heads_class, drafter_class) -> None:
    """What Medusa and Hydra drafters refuse alike: a target or heads of the wrong type, heads
    built for another target, a tree deeper than the heads or asking for more ranks than ids,
    more drafts per step than heads on the static decode path."""
    heads = heads_class(target, 2)
    with pytest.raises(TypeError, match="target"):
        heads_class("target", 2)
    with pytest.raises(TypeError, match="heads"):
        drafter_class(target, target)
    with pytest.raises(TypeError, match="target"):
        drafter_class("target", heads)
    with pytest.raises(ValueError, match="heads: built for a target"):
        drafter_class(target_model("llama", vocab=64), heads)
    with pytest.raises(ValueError, match="deeper"):
        drafter_class(target, heads, tree=product_tree([2, 2, 2]))
    ids = left_padded([4], vocab=111, seed=0)[0]
    with pytest.raises(ValueError, match="tree: a path asks for the rank-111"):
        specdecode.generate(target, drafter_class(target, heads, tree=[(0,), (111,)]), ids, max_new_tokens=4)
    with pytest.raises(ValueError, match="num_draft_tokens"):
        specdecode.generate(target, drafter_class(target, heads), ids, max_new_tokens=4, num_draft_tokens=3,
                            decode_path="static")
