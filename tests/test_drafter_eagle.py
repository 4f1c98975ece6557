"""EagleDrafter and the target features it reads: greedy output is the target's own (three
architectures, chains and trees, full and reduced heads, batch 1 and left-padded batches), the
features handed over equal a plain forward's hidden states at every committed column (through
rejections, re-packs and finished rows), drafters that do not ask get none and the target's
logits do not change, sampling stays lossless (full and reduced head) and broken variants fail
the same test, bad arguments are refused."""

from __future__ import annotations

import pytest
import torch
from test_drafters import hf_greedy
from test_generate_models import INIT, PAD, _one_thread, left_padded, make_model  # noqa: F401
from test_generate_sampling import K, N, PROMPT, V, chi_square_p, exact_joint
from test_generate_sampling import pair as sampling_pair  # noqa: F401

import specdecode
from specdecode.drafters import CommitUpdate, DrafterBase, ModelDrafter, Proposal
from specdecode.drafters.eagle import EagleDrafter, EagleModel
from specdecode.trees.builders import DynamicTree, SequoiaTree

PASS_P, FAIL_P = 1e-4, 1e-6


def target_model(arch: str, seed: int = 0, vocab: int = 111):
    return make_model(arch, seed=seed, vocab=vocab, layers=3, init=INIT.get(arch, 0.02))


def eagle(target, reduced: bool = False, layers=(-1,), seed: int = 0, tree=None) -> EagleDrafter:
    torch.manual_seed(seed)
    vocab = target.get_output_embeddings().weight.shape[0]
    ids = torch.arange(vocab - 1, -1, -2) if reduced else None  # every other id, in a scrambled order
    return EagleDrafter(target, EagleModel(target, layers, ids).eval(), tree=tree)


@pytest.mark.parametrize("shape", ["chain", "tree"])
@pytest.mark.parametrize("head", ["full", "reduced"])
@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_greedy_equals_target_greedy(arch, head, shape):
    target = target_model(arch)
    drafter = eagle(target, reduced=head == "reduced", tree=DynamicTree(6) if shape == "tree" else None)
    one = left_padded([7], vocab=111, seed=2)[0]
    ids, mask = left_padded([5, 9, 2], vocab=111, seed=3)
    out_one = specdecode.generate(target, drafter, one, num_draft_tokens=3, max_new_tokens=16)
    assert torch.equal(out_one.sequences, hf_greedy(target, one, max_new_tokens=16))
    out = specdecode.generate(target, drafter, ids, mask, num_draft_tokens=3, max_new_tokens=16)
    assert torch.equal(out.sequences, hf_greedy(target, ids, mask, max_new_tokens=16))
    assert out.stats.drafter == "eagle" and out.stats.draft_calls > 0


def test_through_custom_generate():
    target = target_model("gpt2")
    ids, mask = left_padded([4, 6], vocab=111, seed=5)
    seq = target.generate(ids, attention_mask=mask, custom_generate=specdecode.custom_generate,
                          draft_model=eagle(target, reduced=True), num_draft_tokens=2, max_new_tokens=12,
                          do_sample=False, pad_token_id=PAD)
    assert torch.equal(seq, hf_greedy(target, ids, mask, max_new_tokens=12))


class Checking(EagleDrafter):
    """Before each proposal: the target feature kept for every real committed column equals the
    hidden states of a plain forward over the row's context."""

    checked = 0

    def propose(self, state, num_tokens):
        pending = state.num_columns - 1
        contexts = state.contexts()
        with torch.no_grad():
            for r, context in enumerate(contexts):
                hidden = self.target(context[None], output_hidden_states=True).hidden_states
                want = torch.cat([hidden[i] for i in self.feature_layers], -1)[0, :-1]  # every column but the pending
                real = state.attention_mask[r, :pending].bool()
                got = self.memory.target_features[r, :pending][real]
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
                Checking.checked += 1
        return super().propose(state, num_tokens)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A llama target and an EAGLE model (features of layers 0, 2 and the last) trained on it
    briefly: accepted often enough that rows accept different lengths (holes, re-packs)."""
    from specdecode.training import train_drafter
    from specdecode.training.data import DataSettings
    from specdecode.training.loop import LoopSettings

    target = target_model("llama", seed=1)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 111, (5,), generator=g).tolist() for _ in range(16)]
    result = train_drafter("eagle", target, tmp_path_factory.mktemp("eagle"), data=prompts, max_steps=40,
                           data_settings=DataSettings(max_length=40, max_new_tokens=32, batch_size=8, top_k=32),
                           loop_settings=LoopSettings(batch_size=8, lr=3e-3, warmup_steps=2), progress=False,
                           feature_layers=(0, 2, -1))
    return target, result.drafter.model


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_features_equal_a_plain_forward(trained, shape, monkeypatch):
    import specdecode.engine.batch as layout

    monkeypatch.setattr(layout, "REPACK_MIN_WASTE", 2)  # re-pack often
    monkeypatch.setattr(layout, "REPACK_MIN_FRACTION", 0.05)
    target, model = trained
    Checking.checked = 0
    tree = DynamicTree(5) if shape == "tree" else None
    drafter = Checking(target, model, tree=tree)
    ids, mask = left_padded([5, 9, 2], vocab=111, seed=4)
    out = specdecode.generate(target, drafter, ids, mask, num_draft_tokens=3, max_new_tokens=24, eos_token_id=[7],
                              pad_token_id=PAD, draft_schedule="constant")
    assert torch.equal(out.sequences, target.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False,
                                                      eos_token_id=[7], pad_token_id=PAD))
    assert Checking.checked > 10 and out.stats.accepted_tokens > 0
    if shape == "chain":
        assert out.stats.repacks > 0


class Recording(ModelDrafter):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.commits: list[CommitUpdate] = []

    def commit(self, update):
        self.commits.append(update)
        super().commit(update)


def test_drafters_that_do_not_ask_get_no_features():
    target = target_model("llama")
    asked = []
    target.register_forward_pre_hook(lambda m, a, kw: asked.append(kw.get("output_hidden_states")), with_kwargs=True)
    drafter = Recording(target_model("llama", seed=5))
    ids, mask = left_padded([5, 3], vocab=111, seed=1)
    specdecode.generate(target, drafter, ids, mask, num_draft_tokens=2, max_new_tokens=8)
    assert drafter.commits and all(c.features is None for c in drafter.commits)
    assert asked and not any(asked)


class Replay(DrafterBase):
    """Proposes, step by step, what another drafter proposed (and asks for no features)."""

    def __init__(self, proposals: list[Proposal]) -> None:
        self.proposals = list(proposals)

    def propose(self, state, num_tokens):
        return self.proposals.pop(0)


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_target_logits_are_the_same_with_a_feature_drafter(shape):
    target = target_model("qwen2", seed=2)
    ids, mask = left_padded([6, 3, 8], vocab=111, seed=6)
    seen: list[torch.Tensor] = []
    target.register_forward_hook(lambda m, a, out: seen.append(out.logits.clone()) if out.logits.shape[0] == 3
                                 else None)  # not the one-row probe of custom masks
    proposals: list[Proposal] = []

    class Keeping(EagleDrafter):
        def propose(self, state, num_tokens):
            proposals.append(super().propose(state, num_tokens))
            return proposals[-1]

    tree = DynamicTree(5) if shape == "tree" else None
    drafter = Keeping(target, eagle(target).model, tree=tree)
    first = specdecode.generate(target, drafter, ids, mask, num_draft_tokens=3, max_new_tokens=12,
                                draft_schedule="constant")
    with_features, seen[:] = list(seen), []
    second = specdecode.generate(target, Replay(proposals), ids, mask, num_draft_tokens=3, max_new_tokens=12,
                                 draft_schedule="constant")
    assert torch.equal(first.sequences, second.sequences)
    # Without features the prompt is scored with the first chain draft (one forward, so the
    # cache and every later logit equal up to rounding); a feature drafter needs the prompt's
    # features first. A first tree keeps the prefill: bit for bit.
    fused = second.stats.fused_prefills
    assert fused == (shape == "chain") and first.stats.fused_prefills == 0
    assert len(seen) + fused == len(with_features) > 2
    for a, b in zip(with_features[fused:], seen):
        if fused:
            torch.testing.assert_close(b, a[:, -b.shape[1]:], rtol=1e-5, atol=1e-5)
        else:
            assert torch.equal(a, b)


def _sample(target, drafter, rule: str | None = "token"):
    ids = torch.tensor([PROMPT]).expand(N, -1)
    out = specdecode.generate(target, drafter, ids, num_draft_tokens=2, rule=rule, do_sample=True, max_new_tokens=K,
                              eos_token_id=[], pad_token_id=PAD, generator=torch.Generator().manual_seed(3))
    assert out.sequences.shape == (N, len(PROMPT) + K)
    return out


@pytest.mark.parametrize("head", ["full", "reduced"])
def test_sampling_is_lossless(sampling_pair, head):
    target, _ = sampling_pair
    joint = exact_joint(target, PROMPT)
    drafter = eagle(target, reduced=head == "reduced", seed=1)
    out = _sample(target, drafter, rule="token" if head == "full" else "block")
    assert 0.05 < out.stats.acceptance_rate < 0.95
    assert chi_square_p(out.sequences[:, len(PROMPT):], joint) > PASS_P


def test_tree_sampling_with_a_reduced_head_is_lossless(sampling_pair):
    target, _ = sampling_pair
    joint = exact_joint(target, PROMPT)
    drafter = eagle(target, reduced=True, seed=1, tree=SequoiaTree(4, max_depth=2))
    out = _sample(target, drafter, rule=None)
    assert out.stats.tree_rule == "rrs" and out.stats.accepted_tokens > 0
    assert chi_square_p(out.sequences[:, len(PROMPT):], joint) > PASS_P


class ClaimsFullSupport(EagleDrafter):
    """Broken: samples from the reduced head but hands over q with finite logits (the target
    head's) outside the kept ids, as if it could have proposed them."""

    def propose(self, state, num_tokens):
        proposal = super().propose(state, num_tokens)
        logits = proposal.draft_logits
        outside = torch.isneginf(logits)
        proposal.draft_logits = torch.where(outside, torch.zeros_like(logits), logits)
        return proposal


class ClaimsArgmax(EagleDrafter):
    """Broken: proposes the draft's argmax while handing over its logits as if it had sampled."""

    def propose(self, state, num_tokens):
        proposal = super().propose(state, num_tokens)
        proposal.draft_tokens = proposal.draft_logits.argmax(-1)
        return proposal


@pytest.mark.parametrize("broken", [ClaimsFullSupport, ClaimsArgmax], ids=["finite_outside", "argmax"])
def test_broken_proposals_fail_the_same_test(sampling_pair, broken):
    target, _ = sampling_pair
    joint = exact_joint(target, PROMPT)
    drafter = broken(target, eagle(target, reduced=True, seed=1).model)
    out = _sample(target, drafter)
    assert chi_square_p(out.sequences[:, len(PROMPT):], joint) < FAIL_P


def test_reduced_head_puts_no_mass_outside_its_vocabulary():
    target = target_model("llama", vocab=V)
    drafter = eagle(target, reduced=True)
    hidden = torch.randn(2, 3, target.config.hidden_size)
    logits = drafter.model.logits(hidden, target.get_output_embeddings(), V)
    kept = torch.zeros(V, dtype=torch.bool)
    kept[drafter.model.draft_to_target] = True
    assert torch.isneginf(logits[..., ~kept]).all() and torch.isfinite(logits[..., kept]).all()
    torch.testing.assert_close(logits[..., drafter.model.draft_to_target], drafter.model.lm_head(hidden))


def test_bad_arguments_are_refused():
    target = target_model("llama")
    with pytest.raises(ValueError, match="feature_layers"):
        EagleModel(target, (5,))
    with pytest.raises(ValueError, match="feature_layers"):
        EagleModel(target, ())
    with pytest.raises(ValueError, match="draft_vocab"):
        EagleModel(target, (-1,), torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="draft_vocab"):
        EagleModel(target, (-1,), torch.tensor([0, 111]))
    model = EagleModel(target)
    with pytest.raises(TypeError, match="model"):
        EagleDrafter(target, target)
    with pytest.raises(TypeError, match="target"):
        EagleDrafter("target", model)
    with pytest.raises(TypeError, match="tree"):
        EagleDrafter(target, model, tree="dynamic")
    with pytest.raises(ValueError, match="model: built for a target"):
        EagleDrafter(target_model("llama", vocab=64), model)
    ids = left_padded([4], vocab=111, seed=0)[0]
    class Resorted(DynamicTree):  # the static decode path drafts the builders it knows only
        pass

    with pytest.raises(ValueError, match="^tree: Resorted builds its trees on the host"):
        specdecode.generate(target, EagleDrafter(target, model, tree=Resorted(4)), ids, max_new_tokens=4,
                            decode_path="static")


def test_generate_tree_arguments_reach_the_drafter():
    """``generate(..., tree="dynamic", num_nodes=, tree_depth=)`` with an EagleDrafter drafts
    trees through ``with_tree``: the target's greedy output, the same steps as the drafter
    built with that tree, and the drafter passed in is left a chain drafter."""
    target = target_model("llama")
    chain = eagle(target, reduced=True)
    ids, mask = left_padded([5, 9, 2], vocab=111, seed=4)
    out = specdecode.generate(target, chain, ids, mask, tree="dynamic", num_nodes=6, tree_depth=3, max_new_tokens=12)
    assert torch.equal(out.sequences, hf_greedy(target, ids, mask, max_new_tokens=12))
    assert chain.tree is None
    built = EagleDrafter(target, chain.model, tree=DynamicTree(num_nodes=6, max_depth=3))
    same = specdecode.generate(target, built, ids, mask, max_new_tokens=12)
    assert same.stats.row_steps == out.stats.row_steps and same.stats.draft_calls == out.stats.draft_calls
    copy = chain.with_tree("sequoia", num_nodes=5)
    assert isinstance(copy.tree, SequoiaTree) and copy.model is chain.model
    assert copy.with_tree(None).tree is None and copy.tree is not None  # back to chains, in a copy
    with pytest.raises(ValueError, match="tree"):
        specdecode.generate(target, chain, ids, mask, tree="bushy", max_new_tokens=4)
    with pytest.raises(ValueError, match="num_nodes"):
        specdecode.generate(target, chain, ids, mask, tree="dynamic", num_nodes=1, max_new_tokens=4)
