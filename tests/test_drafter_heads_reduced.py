"""Medusa and Hydra heads with a reduced head (``set_head_tokens``): logits are the full head's
on the kept ids and ``-inf`` elsewhere, greedy output is the target's own (chains and trees, the
eager and the static decode paths), sampling stays lossless (a sampled chain, Medusa's
deterministic tree) and a broken variant fails the same test, saved ids load back, bad ids and
trees wider than the reduced head are refused."""

from __future__ import annotations

import pytest
import torch
from test_drafter_hydra import random_heads as random_hydra
from test_drafter_medusa import FAIL_P, PASS_P, _sample, assert_greedy_is_the_targets, target_model
from test_drafter_medusa import joint as joint  # noqa: F401  (the fixture)
from test_drafter_medusa import random_heads as random_medusa
from test_drafter_exit_adapter import ClaimsMassOutsideTheHead as ClaimsMassOutsideTheHeadMixin
from test_drafters import hf_greedy
from test_generate_models import _one_thread, left_padded  # noqa: F401
from test_generate_sampling import PROMPT, chi_square_p
from test_generate_sampling import pair as sampling_pair  # noqa: F401

import specdecode
from specdecode.drafters import HydraDrafter
from specdecode.drafters.hydra import HydraHeads
from specdecode.drafters.medusa import MedusaDrafter, MedusaHeads, product_tree

KINDS = {"medusa": (random_medusa, MedusaDrafter), "hydra": (random_hydra, HydraDrafter)}


def reduced(kind: str, target, token_ids, **kwargs):
    make, drafter_class = KINDS[kind]
    heads = make(target, **kwargs)
    heads.set_head_tokens(token_ids)
    return heads, drafter_class


@pytest.mark.parametrize("kind", ["medusa", "hydra"])
def test_logits_are_the_full_heads_on_the_kept_ids(kind):
    target = target_model("llama")
    kept = torch.tensor([90, 3, 57, 4, 12, 3])  # unsorted, one repeat
    heads, _ = reduced(kind, target, kept, num_heads=2, std=0.3)
    assert heads.head_token_ids.tolist() == [3, 4, 12, 57, 90] and heads.num_head_tokens == 5
    feature = torch.randn(3, heads.hidden_size, generator=torch.Generator().manual_seed(1))
    full, small = target.get_output_embeddings(), heads.output_head(target)
    args = (feature,) if kind == "medusa" else (feature, torch.randn(3, 1, heads.hidden_size), 0)
    want, got = heads.logits(*args, full, 111), heads.logits(*args, small, 111)
    outside = torch.ones(111, dtype=torch.bool)
    outside[heads.head_token_ids] = False
    assert torch.isneginf(got[..., outside]).all()
    torch.testing.assert_close(got[..., ~outside], want[..., ~outside])


@pytest.mark.parametrize("path", ["eager", "static"])
@pytest.mark.parametrize("shape", ["chain", "tree"])
@pytest.mark.parametrize("kind", ["medusa", "hydra"])
def test_greedy_equals_target_greedy(kind, shape, path):
    target = target_model("llama")
    heads, drafter_class = reduced(kind, target, torch.arange(2, 80), std=0.05 if kind == "hydra" else 0.3)
    drafter = drafter_class(target, heads, tree=product_tree([3, 2, 1]) if shape == "tree" else None)
    if path == "eager":
        assert_greedy_is_the_targets(target, drafter)
        return
    ids, mask = left_padded([5, 9, 2], vocab=111, seed=3)
    out = specdecode.generate(target, drafter, ids, mask, num_draft_tokens=3, max_new_tokens=16,
                              decode_path="static")
    assert torch.equal(out.sequences, hf_greedy(target, ids, mask, max_new_tokens=16))
    assert out.stats.decode_path == "static" and out.stats.draft_calls > 0


class ClaimsMassOutsideTheHead(ClaimsMassOutsideTheHeadMixin, MedusaDrafter):
    pass


KEPT = torch.tensor([0, 2, 3, 4, 6, 7])  # of the sampling pair's 8 ids


@pytest.mark.parametrize("kind", ["medusa", "hydra"])
def test_sampled_chain_is_lossless_and_a_broken_variant_fails(sampling_pair, joint, kind):
    target, _ = sampling_pair
    heads, drafter_class = reduced(kind, target, KEPT, num_heads=2, std=1.0, seed=1)
    out = _sample(target, drafter_class(target, heads))
    assert 0.05 < out.stats.acceptance_rate < 0.95
    new = out.sequences[:, len(PROMPT):]
    assert ((new == 1) | (new == 5)).any()  # ids outside the head still come from the target
    assert chi_square_p(new, joint) > PASS_P
    if kind == "medusa":
        broken = _sample(target, ClaimsMassOutsideTheHead(target, heads), n=8000)
        assert chi_square_p(broken.sequences[:, len(PROMPT):], joint) < FAIL_P


def test_deterministic_tree_is_lossless(sampling_pair, joint):
    target, _ = sampling_pair
    heads, _ = reduced("medusa", target, KEPT, num_heads=2, std=1.0, seed=1)
    out = _sample(target, MedusaDrafter(target, heads, tree=product_tree([3, 2])))
    assert out.stats.tree_rule == "deterministic" and out.stats.rank_accepted[1] > 100
    assert chi_square_p(out.sequences[:, len(PROMPT):], joint) > PASS_P


@pytest.mark.parametrize("heads_class", [MedusaHeads, HydraHeads])
def test_saved_ids_load_back_and_bad_ids_are_refused(heads_class):
    target = target_model("llama")
    heads = heads_class(target, 2)
    assert heads.head_token_ids is None and "head_token_ids" not in heads.state_dict()
    heads.set_head_tokens(torch.tensor([5, 1, 9]))
    state = {k: v.clone() for k, v in heads.state_dict().items()}
    again = heads_class(target, 2)
    again.load_weights(state)
    assert again.head_token_ids.tolist() == [1, 5, 9] and set(state) == set(again.state_dict())
    plain = heads_class(target, 2)
    plain.load_weights({k: v for k, v in state.items() if k != "head_token_ids"})
    assert plain.head_token_ids is None
    for bad in (torch.tensor([]), torch.tensor([[1, 2]]), torch.tensor([1.0, 2.0]), [1, 2], torch.tensor([-1, 2])):
        with pytest.raises(ValueError, match="head_token_ids"):
            heads_class(target, 2).set_head_tokens(bad)
    with pytest.raises(ValueError, match="head_token_ids: ids must be below the target's 111 ids"):
        heads_class(target, 2).set_head_tokens(torch.tensor([3, 111]))


@pytest.mark.parametrize("kind", ["medusa", "hydra"])
def test_a_tree_wider_than_the_reduced_head_is_refused(kind):
    target = target_model("llama")
    heads, drafter_class = reduced(kind, target, torch.tensor([4, 8]), num_heads=2)
    ids = left_padded([4], vocab=111, seed=0)[0]
    for path in ("eager", "static"):
        with pytest.raises(ValueError, match="tree: a path asks for the rank-2 token .* 2 ids"):
            specdecode.generate(target, drafter_class(target, heads, tree=[(0,), (1,), (2,)]), ids,
                                max_new_tokens=4, decode_path=path)
