"""LayerSkipDrafter (self-speculation with the target's own layers): greedy output is the
target's own, the drafter's logits are exactly a truncated target's, no weight is copied,
sampling through the whole loop is lossless (and broken variants are caught), deeper drafts
are accepted more often on a trained model, bad arguments are refused."""

from __future__ import annotations

import pytest
import torch
from test_drafters import hf_greedy
from test_generate_models import INIT, PAD, _one_thread, left_padded, make_config, make_model  # noqa: F401
from test_generate_sampling import K, N, PROMPT, chi_square_p, exact_joint
from test_generate_sampling import pair as sampling_pair  # noqa: F401

import specdecode
from specdecode import LayerSkipDrafter
from specdecode.drafters import Proposal
from specdecode.models import facts

PASS_P, FAIL_P = 1e-4, 1e-6
GREEDY_ARCHS = ["llama", "gpt2", "qwen2", "gpt_neox"]


def four_layer_model(arch: str, seed: int = 0):
    return make_model(arch, seed=seed, layers=4, init=INIT.get(arch, 0.02))


@pytest.mark.parametrize("spec", [{"num_layers": 1}, {"layers": [1, 3]}], ids=["first1", "subset13"])
@pytest.mark.parametrize("arch", GREEDY_ARCHS)
def test_greedy_equals_target_greedy(arch, spec):
    target = four_layer_model(arch)
    drafter = LayerSkipDrafter(target, **spec)
    one = left_padded([7], seed=2)[0]
    ids, mask = left_padded([5, 9, 2, 7], seed=3)
    out_one = specdecode.generate(target, drafter, one, num_draft_tokens=3, max_new_tokens=20)
    assert torch.equal(out_one.sequences, hf_greedy(target, one))
    out = specdecode.generate(target, drafter, ids, mask, num_draft_tokens=3, max_new_tokens=20)
    assert torch.equal(out.sequences, hf_greedy(target, ids, mask))
    assert out.stats.drafter == "layer_skip" and out.stats.draft_calls > 0
    assert out.stats.accepted_tokens > 0  # the drafts were really used, not all rejected


def test_through_custom_generate():
    target = four_layer_model("llama")
    ids, mask = left_padded([4, 6], seed=5)
    seq = target.generate(ids, attention_mask=mask, custom_generate=specdecode.custom_generate,
                          draft_model=LayerSkipDrafter(target, layers=[0, 2]), num_draft_tokens=2,
                          max_new_tokens=12, do_sample=False, pad_token_id=PAD)
    assert torch.equal(seq, hf_greedy(target, ids, mask, max_new_tokens=12))


def test_shares_every_parameter_and_leaves_the_target_unchanged():
    target = four_layer_model("llama")
    ids = left_padded([6], seed=1)[0]
    with torch.no_grad():
        before = target(ids).logits.clone()
    target_tensors = {id(t): t for t in list(target.parameters()) + list(target.buffers())}
    target_ptrs = {t.data_ptr() for t in target_tensors.values()}
    drafter = LayerSkipDrafter(target, layers=[0, 2, 3])
    view = drafter.model
    view_tensors = list(view.parameters()) + list(view.buffers())
    assert view_tensors and all(id(t) in target_tensors for t in view_tensors)  # the very same tensors
    assert {t.data_ptr() for t in view_tensors} <= target_ptrs  # no storage of its own
    layer_params = [p for p in view.parameters() if p.dim() == 2 and p.shape[0] != 128]
    assert len({p.data_ptr() for p in layer_params}) == len(layer_params) == 3 * 7  # 3 layers x 7 matrices
    # The target is untouched: its config, layer list, layer indices and output.
    assert target.config.num_hidden_layers == 4 and len(target.model.layers) == 4
    assert [layer.self_attn.layer_idx for layer in target.model.layers] == [0, 1, 2, 3]
    assert view.config.num_hidden_layers == 3 and view.config is not target.config
    assert [layer.self_attn.layer_idx for layer in view.model.layers] == [0, 1, 2]
    assert view.model.layers[0] is target.model.layers[0]  # a layer at its own index is not even cloned
    with torch.no_grad():
        assert torch.equal(target(ids).logits, before)


def manual_llama_logits(target, ids: torch.Tensor, num_layers: int) -> torch.Tensor:
    """target's embeddings -> its first ``num_layers`` decoder layers -> final norm -> LM head,
    called module by module (no cache; causal attention over the whole prompt)."""
    inner = target.model
    hidden = inner.embed_tokens(ids)
    positions = torch.arange(ids.shape[1])[None]
    rotary = inner.rotary_emb(hidden, position_ids=positions)
    for layer in inner.layers[:num_layers]:
        hidden = layer(hidden, attention_mask=None, position_ids=positions, position_embeddings=rotary)
    return target.lm_head(inner.norm(hidden))


def truncated_copy(target, arch: str, layers: list[int]):
    """An independent model with only ``layers`` (weights copied from ``target``): the
    reference a layer-skip view must equal."""
    from transformers import AutoModelForCausalLM

    config = make_config(arch, layers=len(layers), init=INIT.get(arch, 0.02))
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    prefix = facts.decoder_layers_path(target) + "."
    state = {}
    for key, value in target.state_dict().items():
        if key.startswith(prefix):
            index, rest = key[len(prefix):].split(".", 1)
            if int(index) not in layers:
                continue
            key = f"{prefix}{layers.index(int(index))}.{rest}"
        state[key] = value
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and not missing, (missing, unexpected)
    return model


class Recording(LayerSkipDrafter):
    """Records every proposal with the row's context at the time it was made."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[torch.Tensor, Proposal]] = []

    def propose(self, state, num_tokens):
        context = state.contexts()[0].clone()
        proposal = super().propose(state, num_tokens)
        self.seen.append((context, proposal))
        return proposal


def test_logits_equal_the_manual_computation():
    target = four_layer_model("llama")
    ids = left_padded([9], seed=4)[0]
    for k in (1, 3):
        drafter = Recording(target, num_layers=k)
        specdecode.generate(target, drafter, ids, num_draft_tokens=2, max_new_tokens=2)
        with torch.no_grad():
            manual = manual_llama_logits(target, ids, k)[:, -1]
        first = drafter.seen[0][1].draft_logits[:, 0]
        torch.testing.assert_close(first, manual, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", GREEDY_ARCHS)
def test_every_proposal_equals_a_truncated_model(arch):
    """Across a whole generation (KV cache filled, rolled back after rejections), each draft
    position's logits equal a separately built model with only those layers, run without a
    cache on the context and the tokens drafted before it."""
    target = four_layer_model(arch, seed=1)
    layers = [1, 3]
    reference = truncated_copy(target, arch, layers)
    drafter = Recording(target, layers=layers)
    ids = left_padded([6], seed=7)[0]
    out = specdecode.generate(target, drafter, ids, num_draft_tokens=3, max_new_tokens=16)
    assert out.stats.rejections > 0 and len(drafter.seen) > 2
    with torch.no_grad():
        for context, proposal in drafter.seen:
            for i in range(proposal.num_tokens):
                seq = torch.cat([context, proposal.draft_tokens[0, :i]])[None]
                expected = reference(seq).logits[:, -1]
                torch.testing.assert_close(proposal.draft_logits[:, i], expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("rule", ["token", "block"])
def test_sampling_is_lossless(sampling_pair, rule):
    target, _ = sampling_pair
    joint = exact_joint(target, PROMPT)
    out = _sample(target, LayerSkipDrafter(target, num_layers=1), rule)
    assert 0.1 < out.stats.acceptance_rate < 0.9
    assert chi_square_p(out.sequences[:, len(PROMPT):], joint) > PASS_P


class ArgmaxClaimingQ(LayerSkipDrafter):
    """Broken: proposes the draft's argmax while handing over its logits as if it had sampled."""

    def propose(self, state, num_tokens):
        proposal = super().propose(state, num_tokens)
        proposal.draft_tokens = proposal.draft_logits.argmax(-1)
        return proposal


class FullDepthQ(LayerSkipDrafter):
    """Broken: samples with the first layer, but its proposals are verified against q computed
    with every layer (the wrong layer count)."""

    def __init__(self, target) -> None:
        super().__init__(target, num_layers=1)
        self.full = target

    def propose(self, state, num_tokens):
        proposal = super().propose(state, num_tokens)
        n, k = state.num_columns, proposal.num_tokens
        b = state.batch_size
        ids = torch.cat([state.tokens[:, :n], proposal.draft_tokens[:, : k - 1]], 1)
        mask = torch.cat([state.attention_mask[:, :n], torch.ones((b, k - 1), dtype=torch.long)], 1)
        positions = torch.cat([state.positions[:, :n], state.positions[:, n - 1: n] + torch.arange(1, k)], 1)
        logits = self.full(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        proposal.draft_logits = logits[:, -k:].float()
        return proposal


@pytest.mark.parametrize("broken", [ArgmaxClaimingQ, FullDepthQ], ids=["argmax_claims_q", "full_depth_q"])
def test_broken_layer_skip_fails_the_same_test(sampling_pair, broken):
    target, _ = sampling_pair
    joint = exact_joint(target, PROMPT)
    drafter = ArgmaxClaimingQ(target, num_layers=1) if broken is ArgmaxClaimingQ else FullDepthQ(target)
    out = _sample(target, drafter, "token")
    assert chi_square_p(out.sequences[:, len(PROMPT):], joint) < FAIL_P


def _sample(target, drafter, rule):
    ids = torch.tensor([PROMPT]).expand(N, -1)
    out = specdecode.generate(target, drafter, ids, num_draft_tokens=2, rule=rule, do_sample=True, max_new_tokens=K,
                              eos_token_id=[], pad_token_id=PAD, generator=torch.Generator().manual_seed(4))
    assert out.sequences.shape == (N, len(PROMPT) + K)
    return out


def test_deeper_drafts_are_accepted_more_often_on_the_trained_pair():
    """Sanity check on the trained 6-layer demo target (not a timing): drafting with 5 of its
    layers is accepted more often than with 1, and both reproduce the target's greedy output."""
    from specdecode.demo import demo_prompts

    target, _, tok = specdecode.load_demo_pair()
    assert len(facts.decoder_layers(target)) == 6
    tok.padding_side = "left"
    batch = tok(demo_prompts(4), return_tensors="pt", padding=True)
    ids, mask = batch.input_ids[:, -48:], batch.attention_mask[:, -48:]
    reference = target.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False,
                                pad_token_id=tok.pad_token_id)
    rates = {}
    for k in (1, 5):
        out = specdecode.generate(target, LayerSkipDrafter(target, num_layers=k), ids, mask, num_draft_tokens=4,
                                  max_new_tokens=24, pad_token_id=tok.pad_token_id)
        assert torch.equal(out.sequences, reference[:, : out.sequences.shape[1]])
        rates[k] = out.stats.acceptance_rate
    assert rates[5] > rates[1] + 0.1, rates


def test_bad_arguments_are_refused():
    target = four_layer_model("llama")
    with pytest.raises(ValueError, match="num_layers: give exactly one"):
        LayerSkipDrafter(target)
    with pytest.raises(ValueError, match="num_layers: give exactly one"):
        LayerSkipDrafter(target, 1, layers=[0])
    for bad in (0, 4, -1):
        with pytest.raises(ValueError, match=r"num_layers: expected an int in \[1, 3\]"):
            LayerSkipDrafter(target, num_layers=bad)
    with pytest.raises(TypeError, match="num_layers"):
        LayerSkipDrafter(target, num_layers=2.0)
    with pytest.raises(ValueError, match=r"layers: every index must lie in \[0, 3\]"):
        LayerSkipDrafter(target, layers=[0, 4])
    with pytest.raises(ValueError, match="layers: every index"):
        LayerSkipDrafter(target, layers=[-1, 2])
    with pytest.raises(ValueError, match="strictly increasing"):
        LayerSkipDrafter(target, layers=[2, 1])
    with pytest.raises(ValueError, match="strictly increasing"):
        LayerSkipDrafter(target, layers=[1, 1])
    with pytest.raises(ValueError, match="layers: expected 1 to 3"):
        LayerSkipDrafter(target, layers=[])
    with pytest.raises(ValueError, match="layers: expected 1 to 3"):
        LayerSkipDrafter(target, layers=[0, 1, 2, 3])
    with pytest.raises(TypeError, match="layers"):
        LayerSkipDrafter(target, layers="01")
    with pytest.raises(TypeError, match="target"):
        LayerSkipDrafter(torch.nn.Linear(2, 2), num_layers=1)

    class NoLayers(torch.nn.Module):
        config = target.config

    with pytest.raises(ValueError, match="target: .*cannot find the decoder layers"):
        LayerSkipDrafter(NoLayers(), num_layers=1)


def test_a_moved_layer_without_layer_idx_is_refused():
    target = four_layer_model("llama")
    for module in target.model.layers[2].modules():
        module.__dict__.pop("layer_idx", None)
    LayerSkipDrafter(target, num_layers=2)  # layers at their own index need no renumbering
    with pytest.raises(ValueError, match="layers: decoder layer 2 .* has no layer_idx"):
        LayerSkipDrafter(target, layers=[0, 2])
