"""HydraDrafter: greedy output is the target's own (three architectures, chains and trees, batch 1
and left-padded batches), the feature each proposal reads is the target's last hidden state at
the row's last committed token, head ``i`` reads the tokens drafted before it (exact heads are
always accepted, in chains and in trees whose nodes are conditioned on their paths), sampling
stays lossless for the sampled chain and the deterministic tree, broken variants fail the same
test, bad arguments."""

from __future__ import annotations

import pytest
import torch
from test_drafter_medusa import (  # noqa: F401
    FAIL_P,
    PASS_P,
    FeatureCheck,
    _sample,
    assert_drafter_refuses_bad_arguments,
    assert_greedy_is_the_targets,
    joint,
    target_model,
)
from test_drafters import hf_greedy
from test_generate_models import _one_thread, left_padded  # noqa: F401
from test_generate_sampling import PROMPT, chi_square_p, exact_joint
from test_generate_sampling import pair as sampling_pair  # noqa: F401

import specdecode
from specdecode.drafters import HydraDrafter
from specdecode.drafters.hydra import HydraHeads
from specdecode.drafters.medusa import product_tree


def random_heads(target, num_heads: int = 3, head_layers: int = 2, std: float = 0.3, seed: int = 0) -> HydraHeads:
    heads = HydraHeads(target, num_heads, head_layers)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * std)
    return heads.eval()


@pytest.mark.parametrize("shape", ["chain", "tree"])
@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_greedy_equals_target_greedy(arch, shape):
    target = target_model(arch)
    tree = product_tree([3, 2, 1]) if shape == "tree" else None
    drafter = HydraDrafter(target, random_heads(target), tree=tree)
    assert drafter.name == "hydra"
    assert_greedy_is_the_targets(target, drafter)


class Oracle(HydraHeads):
    """Exact heads for one known greedy continuation ``y``: the feature fixes ``t`` (the nearest
    true feature) and head ``i`` checks that the tokens it reads are ``y_{t+1} .. y_{t+1+i}``;
    then it returns the feature of ``y_{t+1+i}`` (the target's head on it gives ``y_{t+2+i}``),
    else a feature whose argmax is another token. So only a drafter that feeds each head the
    tokens drafted before it (the pending token first) is accepted at every draft."""

    def __init__(self, target, num_heads: int, sequence: torch.Tensor) -> None:
        super().__init__(target, num_heads)
        with torch.no_grad():
            self.table = target(sequence[None], output_hidden_states=True).hidden_states[-1][0]
        self.sequence = sequence
        self.embedding = target.get_input_embeddings().weight
        self.calls = 0

    def forward(self, features, embeds, head):
        self.calls += 1
        flat_f = features.reshape(-1, features.shape[-1])
        flat_e = embeds.reshape(-1, head + 1, embeds.shape[-1])
        rows = []
        for f, e in zip(flat_f, flat_e):
            t = int((self.table - f).norm(dim=-1).argmin())
            read = (e[:, None] - self.embedding[None]).norm(dim=-1).argmin(-1)  # the token ids it was given
            n = len(self.sequence)
            want = self.sequence[min(t + 1, n - 1): min(t + 2 + head, n)]
            k = min(t + 1 + head, n - 1)
            good = len(want) == head + 1 and torch.equal(read, want)
            rows.append(self.table[k] if good else -self.table[k])
        return torch.stack(rows).reshape(features.shape)


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_exact_heads_are_always_accepted(shape):
    target = target_model("qwen2", seed=3)
    ids = left_padded([6], vocab=111, seed=5)[0]
    want = hf_greedy(target, ids, max_new_tokens=12)
    heads = Oracle(target, 3, want[0]).eval()
    tree = product_tree([2, 2, 1]) if shape == "tree" else None
    out = specdecode.generate(target, HydraDrafter(target, heads, tree=tree), ids, num_draft_tokens=3,
                              max_new_tokens=12)
    assert torch.equal(out.sequences, want)
    if shape == "chain":
        assert out.stats.acceptance_rate == 1.0
    else:
        assert out.stats.accepted_tokens >= 9


class Checking(FeatureCheck, HydraDrafter):
    pass


def test_features_are_the_last_committed_tokens():
    target = target_model("llama", seed=1)
    Checking.checked = 0
    ids, mask = left_padded([5, 9, 1], vocab=111, seed=4)
    drafter = Checking(target, random_heads(target, std=0.05), tree=product_tree([2, 2]))
    out = specdecode.generate(target, drafter, ids, mask, num_draft_tokens=3, max_new_tokens=16)
    assert torch.equal(out.sequences, hf_greedy(target, ids, mask, max_new_tokens=16))
    assert Checking.checked > 10


@pytest.mark.parametrize("settings", [{}, {"temperature": 0.7, "top_k": 4}], ids=["plain", "t0.7-top4"])
def test_sampled_chain_is_lossless(sampling_pair, joint, settings):
    target, _ = sampling_pair
    want = exact_joint(target, PROMPT, **settings) if settings else joint
    out = _sample(target, HydraDrafter(target, random_heads(target, 2, std=1.0, seed=1)), **settings)
    assert 0.05 < out.stats.acceptance_rate < 0.95 and out.stats.accepted_tokens > 1000
    assert chi_square_p(out.sequences[:, len(PROMPT):], want) > PASS_P


def test_tree_is_lossless(sampling_pair, joint):
    target, _ = sampling_pair
    drafter = HydraDrafter(target, random_heads(target, 2, std=0.5, seed=1), tree=product_tree([3, 2]))
    out = _sample(target, drafter)
    assert out.stats.tree_rule == "deterministic" and out.stats.rank_accepted[1] > 100
    assert chi_square_p(out.sequences[:, len(PROMPT):], joint) > PASS_P


class StaleQ(HydraDrafter):
    """Broken: draft 2 is drawn from head 1 given draft 1, but its q is head 1's distribution
    given another first token (the next id: a q conditioned on a token that was not drafted)."""

    def propose(self, state, num_tokens):
        proposal = super().propose(state, num_tokens)
        if proposal.draft_tokens.shape[1] < 2:
            return proposal
        feature = self._feature(state, self.heads.hidden_size, self.heads.dtype)
        root = state.tokens[:, state.num_columns - 1].to(state.device)
        other = (proposal.draft_tokens[:, 0] + 1) % state.vocab_size
        embeds = torch.stack([self._embed(root), self._embed(other)], 1)
        logits = self._logits(state, feature, embeds, 1)
        proposal.draft_logits[:, 1] = state.process_draft_logits(logits, proposal.draft_tokens[:, :1])
        return proposal


class SwappedLogits(HydraDrafter):
    """Broken: the heads' q handed over in the wrong order (draft i verified against draft
    ``1 - i``'s distribution)."""

    def propose(self, state, num_tokens):
        proposal = super().propose(state, num_tokens)
        proposal.draft_logits = proposal.draft_logits.flip(1)
        return proposal


@pytest.mark.parametrize("broken", [StaleQ, SwappedLogits])
def test_broken_variants_fail_the_same_test(sampling_pair, joint, broken):
    target, _ = sampling_pair
    out = _sample(target, broken(target, random_heads(target, 2, std=1.0, seed=1)))
    assert chi_square_p(out.sequences[:, len(PROMPT):], joint) < FAIL_P


def test_bad_arguments_are_refused():
    target = target_model("llama")
    heads = HydraHeads(target, 2)
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="num_heads"):
            HydraHeads(target, bad)
        with pytest.raises(ValueError, match="head_layers"):
            HydraHeads(target, 2, bad)
    with pytest.raises(ValueError, match="tree"):
        HydraDrafter(target, heads, tree=[(0, 0)])
    with pytest.raises(ValueError, match="embeds"):
        heads(torch.zeros(1, 48), torch.zeros(1, 1, 48), 1)
    with pytest.raises(ValueError, match="head"):
        heads(torch.zeros(1, 48), torch.zeros(1, 3, 48), 2)
    assert_drafter_refuses_bad_arguments(target, HydraHeads, HydraDrafter)
