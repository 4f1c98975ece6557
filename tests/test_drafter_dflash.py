"""DFlashDrafter: greedy output is the target's own (three architectures; chains and rank-path
trees; batch 1 and left-padded batches; the eager, static and compiled decode paths), every
proposal's block logits equal a from-scratch reference over the row's own context (through
rejections, re-packs and finished rows), sampling stays lossless (sampled chains at T = 1 and
with top-k, the deterministic tree, the static path) and broken variants fail the same test,
and bad arguments are refused by name."""

from __future__ import annotations

import pytest
import torch
from test_drafters import hf_greedy
from test_generate_models import PAD, left_padded, make_model
from test_generate_sampling import K, N, PROMPT, chi_square_p, exact_joint
from test_generate_sampling import pair as sampling_pair  # noqa: F401

import specdecode
from specdecode.drafters import DFlashDrafter
from specdecode.drafters.dflash_model import DFlashConfig, DFlashModel, default_target_layer_ids
from specdecode.drafters.medusa import product_tree

PASS_P, FAIL_P = 1e-4, 1e-6


def target_model(arch: str = "llama", seed: int = 0, vocab: int = 111):
    return make_model(arch, seed=seed, vocab=vocab, layers=3, init={"gpt2": 0.08}.get(arch, 0.02))


def random_dflash(target, block_size: int = 5, num_layers: int = 2, std: float = 0.3, seed: int = 0,
                  **config) -> DFlashModel:
    cfg = DFlashConfig.for_target(target, num_layers=num_layers, block_size=block_size, **config)
    model = DFlashModel(target, cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * std)
    return model.eval()


@pytest.mark.parametrize("shape", ["chain", "tree"])
@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_greedy_equals_target_greedy_eager_and_static(arch, shape):
    target = target_model(arch)
    tree = product_tree([3, 2, 1]) if shape == "tree" else None
    drafter = DFlashDrafter(target, random_dflash(target), tree=tree)
    one = left_padded([7], vocab=111, seed=2)[0]
    ids, mask = left_padded([5, 9, 2], vocab=111, seed=3)
    for path in ("eager", "static"):
        out_one = specdecode.generate(target, drafter, one, num_draft_tokens=3, max_new_tokens=16, decode_path=path)
        assert torch.equal(out_one.sequences, hf_greedy(target, one, max_new_tokens=16))
        out = specdecode.generate(target, drafter, ids, mask, num_draft_tokens=3, max_new_tokens=16, decode_path=path)
        assert torch.equal(out.sequences, hf_greedy(target, ids, mask, max_new_tokens=16))
        assert out.stats.drafter == "dflash" and out.stats.draft_calls > 0


def test_static_drafts_equal_the_eager_drafts():
    """The same network proposes the same drafts on both paths (acceptance and calls agree)."""
    target = target_model("llama", seed=4, vocab=7)
    drafter = DFlashDrafter(target, often_right(target))
    ids, mask = left_padded([6, 3], vocab=7, seed=5)
    eager = specdecode.generate(target, drafter, ids, mask, num_draft_tokens=4, max_new_tokens=20,
                                draft_schedule="constant")
    static = specdecode.generate(target, drafter, ids, mask, num_draft_tokens=4, max_new_tokens=20,
                                 decode_path="static")
    assert torch.equal(eager.sequences, static.sequences)
    assert eager.stats.accepted_tokens == static.stats.accepted_tokens > 0


def often_right(target):
    """A network with large weights for a 7-token target: peaked, context-dependent drafts,
    often right and often wrong (rows accept different lengths)."""
    return random_dflash(target, block_size=6, std=0.6, seed=3)


class Checking(DFlashDrafter):
    """Before each proposal: the block logits equal a reference computed from scratch for every
    row (a plain target forward over the row's committed tokens, its features projected anew,
    the block at the row's own positions); counts the rows checked."""

    checked = 0

    def propose(self, state, num_tokens):
        got = self._block_logits(state)
        with torch.no_grad():
            for r, context in enumerate(state.contexts()):
                want = reference_logits(self.target, self.model, context)
                torch.testing.assert_close(got[r], want, rtol=1e-4, atol=1e-4)
                type(self).checked += 1
        return super().propose(state, num_tokens)


def reference_logits(target, model: DFlashModel, context: torch.Tensor) -> torch.Tensor:
    """The block logits for one row from its real tokens (the pending one last), from scratch.
    Shape: returns ``[block_size - 1, V]``."""
    n = len(context)
    size = model.block_size
    cfg = model.config
    if n > 1:
        hidden = target(context[None, :-1], output_hidden_states=True).hidden_states
        feats = torch.cat([hidden[i] for i in model.feature_layers], -1)
        pairs = model.context_keys_values(feats, torch.arange(n - 1)[None])
    else:
        empty = torch.zeros((1, cfg.num_kv_heads, 0, cfg.head_dim))
        pairs = [(empty, empty)] * cfg.num_layers
    tokens = context[-1:].expand(size)[None]
    is_mask = (torch.arange(size) > 0)[None]
    mask = torch.ones((1, 1, size, n - 1 + size), dtype=torch.bool)
    out = model(model.block_embeddings(target, tokens, is_mask), (n - 1 + torch.arange(size))[None], pairs, mask)
    return target.get_output_embeddings()(out[0, 1:]).float()


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_block_logits_equal_a_from_scratch_reference(shape, monkeypatch):
    import specdecode.engine.batch as layout

    monkeypatch.setattr(layout, "REPACK_MIN_WASTE", 2)  # re-pack often
    monkeypatch.setattr(layout, "REPACK_MIN_FRACTION", 0.05)
    target = target_model("llama", seed=1, vocab=7)
    Checking.checked = 0
    tree = product_tree([2, 2, 1]) if shape == "tree" else None
    ids, mask = left_padded([5, 9, 1], vocab=7, seed=4)
    want = target.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False, eos_token_id=[6],
                           pad_token_id=PAD)
    drafter = Checking(target, often_right(target), tree=tree)
    out = specdecode.generate(target, drafter, ids, mask, num_draft_tokens=3, max_new_tokens=24, eos_token_id=[6],
                              pad_token_id=PAD, draft_schedule="constant")
    assert torch.equal(out.sequences, want)
    assert Checking.checked > 10 and out.stats.accepted_tokens > 5
    if shape == "chain":
        assert out.stats.repacks > 0 and out.stats.acceptance_rate < 1.0


def test_compiled_path_traces_whole_and_compiles_once(monkeypatch):
    """Chains and trees on the compiled path: greedy output is the target's, and a second
    generation compiles nothing (the step traced whole, as for Inductor)."""
    import specdecode.engine.compiled as compiled
    from torch._dynamo.utils import counters

    monkeypatch.setattr(compiled, "BACKEND", "aot_eager")
    target = target_model("llama", seed=2)
    ids, mask = left_padded([4, 7], vocab=111, seed=6)
    want = hf_greedy(target, ids, mask, max_new_tokens=12)
    for tree in (None, [(0,), (1,), (0, 0)]):
        drafter = DFlashDrafter(target, random_dflash(target, seed=5), tree=tree)
        runs = []
        for _ in range(2):
            before = counters["stats"]["unique_graphs"]
            runs.append(specdecode.generate(target, drafter, ids, mask, num_draft_tokens=3, max_new_tokens=12,
                                            decode_path="compiled", pad_token_id=PAD))
        assert all(torch.equal(out.sequences, want) and out.stats.decode_path == "compiled" for out in runs)
        assert counters["stats"]["unique_graphs"] == before  # the second generation compiled nothing


def test_static_propose_reads_nothing_on_the_host():
    from test_static_features import guard_static_propose

    target = target_model("llama", seed=3)
    drafter = DFlashDrafter(target, random_dflash(target, seed=4))
    calls = guard_static_propose(drafter)
    ids, mask = left_padded([5, 3], vocab=111, seed=8)
    out = specdecode.generate(target, drafter, ids, mask, num_draft_tokens=3, max_new_tokens=10, do_sample=True,
                              decode_path="static", pad_token_id=PAD, generator=torch.Generator().manual_seed(0))
    assert calls[0] == out.stats.decode_steps_run > 0


# ------------------------------------------------------------------------ sampling exactness


def _sample(target, drafter, n: int = N, **kwargs):
    ids = torch.tensor([PROMPT]).expand(n, -1)
    out = specdecode.generate(target, drafter, ids, num_draft_tokens=2, do_sample=True, max_new_tokens=K,
                              eos_token_id=[], pad_token_id=PAD, generator=torch.Generator().manual_seed(3), **kwargs)
    assert out.sequences.shape == (n, len(PROMPT) + K)
    return out


def sampling_drafter(target, tree=None, cls=DFlashDrafter):
    return cls(target, random_dflash(target, block_size=4, std=1.0, seed=1), tree=tree)


@pytest.fixture(scope="module")
def joint(sampling_pair):
    return exact_joint(sampling_pair[0], PROMPT)


@pytest.mark.parametrize("path, rule", [("eager", "token"), ("eager", "block"), ("static", "token")])
def test_sampled_chain_is_lossless(sampling_pair, joint, path, rule):
    target, _ = sampling_pair
    out = _sample(target, sampling_drafter(target), decode_path=path, rule=rule)
    assert 0.05 < out.stats.acceptance_rate < 0.95
    assert chi_square_p(out.sequences[:, len(PROMPT):], joint) > PASS_P


def test_sampled_chain_is_lossless_with_temperature_and_top_k(sampling_pair):
    target, _ = sampling_pair
    joint = exact_joint(target, PROMPT, temperature=0.7, top_k=4)
    out = _sample(target, sampling_drafter(target), temperature=0.7, top_k=4)
    assert out.stats.accepted_tokens > 1000
    assert chi_square_p(out.sequences[:, len(PROMPT):], joint) > PASS_P


@pytest.mark.parametrize("path", ["eager", "static"])
def test_tree_is_lossless(sampling_pair, joint, path):
    target, _ = sampling_pair
    out = _sample(target, sampling_drafter(target, tree=product_tree([3, 2])), decode_path=path)
    assert out.stats.tree_rule == "deterministic" and out.stats.accepted_tokens > 1000
    assert chi_square_p(out.sequences[:, len(PROMPT):], joint) > PASS_P


class StaleContext(DFlashDrafter):
    """Broken: the drafts are drawn from the block that sees every committed column, but
    verified against the block that misses the last one (an off-by-one in the projected
    columns)."""

    def propose(self, state, num_tokens):
        proposal = super().propose(state, num_tokens)
        last = state.num_columns - 2
        if last >= 0:
            kept = [(k.data[:, :, last].clone(), v.data[:, :, last].clone()) for k, v in self.context]
            for k, v in self.context:
                k.data[:, :, last] = 0
                v.data[:, :, last] = 0
            stale = self._block_logits(state)
            for (k, v), (old_k, old_v) in zip(self.context, kept):
                k.data[:, :, last] = old_k
                v.data[:, :, last] = old_v
            proposal.draft_logits = stale[:, : proposal.draft_tokens.shape[1]]
        return proposal


class ClaimsIid(DFlashDrafter):
    """Broken: the top-k tree verified as if each node's children were i.i.d. draws from the
    distribution of their depth's block position (the engine then picks SpecInfer's rule)."""

    def propose(self, state, num_tokens):
        proposal = super().propose(state, num_tokens)
        n = proposal.draft_tokens.shape[1]
        logits = self._block_logits(state)
        depth = torch.zeros(n, dtype=torch.long)
        for j in range(1, n):
            depth[j] = depth[int(proposal.tree.parents[0, j])] + 1
        proposal.draft_logits = logits[:, depth.clamp_max(logits.shape[1] - 1)]
        proposal.children = "iid"
        return proposal


@pytest.mark.parametrize("broken", ["stale", "iid"])
def test_broken_variants_fail_the_same_test(sampling_pair, joint, broken):
    target, _ = sampling_pair
    if broken == "stale":
        drafter = sampling_drafter(target, cls=StaleContext)
    else:
        drafter = sampling_drafter(target, tree=product_tree([3, 2]), cls=ClaimsIid)
    out = _sample(target, drafter, n=8000)
    assert chi_square_p(out.sequences[:, len(PROMPT):], joint) < FAIL_P


# ------------------------------------------------------------------------ arguments


def test_config_helpers():
    assert default_target_layer_ids(36, 5) == (1, 9, 17, 25, 33)
    assert default_target_layer_ids(3, 1) == (1,)
    assert default_target_layer_ids(1, 2) == (0,)
    target = target_model("llama")
    cfg = DFlashConfig.for_target(target, num_layers=1, block_size=8)
    assert cfg.hidden_size == 48 and cfg.num_kv_heads == 2 and cfg.block_size == 8
    assert DFlashConfig.from_dict(cfg.as_dict()) == cfg


def test_bad_arguments_are_refused():
    target = target_model("llama")
    for bad in (1, 0, 2.5, True):
        with pytest.raises(ValueError, match="block_size"):
            DFlashConfig.for_target(target, block_size=bad)
    with pytest.raises(ValueError, match="num_layers"):
        DFlashConfig.for_target(target, num_layers=0)
    for bad in ([3], [0, 0], [], "1", [1.0]):
        with pytest.raises(ValueError, match="target_layer_ids"):
            DFlashConfig.for_target(target, target_layer_ids=bad)
    with pytest.raises(ValueError, match="mask_token_id"):
        DFlashModel(target, DFlashConfig.for_target(target, mask_token_id=111))
    with pytest.raises(ValueError, match="draft_vocab"):
        DFlashModel(target, DFlashConfig.for_target(target), draft_vocab=torch.tensor([1, 1]))
    model = random_dflash(target)
    with pytest.raises(TypeError, match="model"):
        DFlashDrafter(target, target)
    with pytest.raises(TypeError, match="target"):
        DFlashDrafter("target", model)
    with pytest.raises(ValueError, match="model: built for a target"):
        DFlashDrafter(target_model("llama", vocab=64), model)
    with pytest.raises(ValueError, match="deeper"):
        DFlashDrafter(target, model, tree=product_tree([2, 2, 2, 2, 2]))
    ids = left_padded([4], vocab=111, seed=0)[0]
    with pytest.raises(ValueError, match="tree: a path asks for the rank-111"):
        specdecode.generate(target, DFlashDrafter(target, model, tree=[(0,), (111,)]), ids, max_new_tokens=4)
    with pytest.raises(ValueError, match="num_draft_tokens"):
        specdecode.generate(target, DFlashDrafter(target, model), ids, max_new_tokens=4, num_draft_tokens=5,
                            decode_path="static")
    # eager: more drafts than the block holds is a shorter chain, not an error
    out = specdecode.generate(target, DFlashDrafter(target, model), ids, max_new_tokens=8, num_draft_tokens=9)
    assert torch.equal(out.sequences, hf_greedy(target, ids, max_new_tokens=8))


def test_reduced_draft_vocabulary_drafts_only_its_ids():
    target = target_model("llama", seed=3)
    ids_kept = torch.arange(0, 111, 3)
    model = random_dflash(target, seed=2)
    reduced = DFlashModel(target, model.config, draft_vocab=ids_kept)
    reduced.load_state_dict(model.state_dict(), strict=False)
    drafter = DFlashDrafter(target, reduced.eval())
    prompt = left_padded([6], vocab=111, seed=1)[0]
    seen = []

    class Spy(DFlashDrafter):
        def propose(self, state, num_tokens):
            p = super().propose(state, num_tokens)
            seen.append(p.draft_tokens)
            return p

    spy = Spy(target, reduced.eval())
    out = specdecode.generate(target, spy, prompt, max_new_tokens=12, num_draft_tokens=3)
    assert torch.equal(out.sequences, hf_greedy(target, prompt, max_new_tokens=12))
    assert all(bool(torch.isin(t, ids_kept).all()) for t in seen)
    assert drafter.describe()["draft_vocab"] == ids_kept.numel()
