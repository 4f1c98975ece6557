"""ExitAdapterDrafter (self-speculation through an exit adapter): greedy output is the target's
own on three architectures (batch 1 and a left-padded batch of 3; layer and linear adapters,
full and reduced heads); the drafter's logits are the manual computation (target layers, adapter,
head; -inf outside a reduced head); no target tensor is copied and the target is untouched; the
whole-loop exact sampling test passes with a reduced head (q = 0 outside it) and fails for a
broken variant; bad arguments are refused."""

from __future__ import annotations

import pytest
import torch
from test_drafters import hf_greedy
from test_generate_models import INIT, PAD, _one_thread, left_padded, make_model  # noqa: F401
from test_generate_sampling import K, N, PROMPT, chi_square_p, exact_joint
from test_generate_sampling import pair as sampling_pair  # noqa: F401

import specdecode
from specdecode.drafters import ExitAdapter, ExitAdapterDrafter

PASS_P, FAIL_P = 1e-4, 1e-6
ARCHS = ["llama", "gpt2", "qwen2"]


def four_layer_model(arch: str, seed: int = 0):
    return make_model(arch, seed=seed, layers=4, init=INIT.get(arch, 0.02))


def perturbed_adapter(target, exit_layer: int, kind: str = "layer", head_tokens=None, scale: float = 0.01,
                      seed: int = 0) -> ExitAdapter:
    """An adapter whose weights moved away from the target's (as training would move them)."""
    adapter = ExitAdapter.from_target(target, exit_layer, kind)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in adapter.parameters():
            param.add_(torch.randn(param.shape, generator=g) * scale)
    adapter.set_head_tokens(head_tokens)
    return adapter.requires_grad_(False).eval()


SPECS = {"layer": dict(kind="layer"), "linear": dict(kind="linear"),
         "reduced": dict(kind="layer", head_tokens=torch.arange(3, 100))}


@pytest.mark.parametrize("spec", list(SPECS))
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_equals_target_greedy(arch, spec):
    target = four_layer_model(arch)
    drafter = ExitAdapterDrafter(target, perturbed_adapter(target, 2, **SPECS[spec]))
    one = left_padded([7], seed=2)[0]
    ids, mask = left_padded([5, 9, 2], seed=3)
    out_one = specdecode.generate(target, drafter, one, num_draft_tokens=3, max_new_tokens=16)
    assert torch.equal(out_one.sequences, hf_greedy(target, one, max_new_tokens=16))
    out = specdecode.generate(target, drafter, ids, mask, num_draft_tokens=3, max_new_tokens=16,
                              draft_schedule="constant")
    assert torch.equal(out.sequences, hf_greedy(target, ids, mask, max_new_tokens=16))
    assert out.stats.drafter == "exit_adapter" and out.stats.accepted_tokens > 0


class Recording(ExitAdapterDrafter):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list = []

    def propose(self, state, num_tokens):
        proposal = super().propose(state, num_tokens)
        self.seen.append(proposal)
        return proposal


def manual_logits(target, adapter, ids: torch.Tensor) -> torch.Tensor:
    """Embeddings -> the target's first k layers -> the adapter's layer and norm -> the head."""
    inner = target.model
    hidden = inner.embed_tokens(ids)
    positions = torch.arange(ids.shape[1])[None]
    rotary = inner.rotary_emb(hidden, position_ids=positions)
    for layer in list(inner.layers[: adapter.exit_layer]) + [adapter.layer]:
        hidden = layer(hidden, attention_mask=None, position_ids=positions, position_embeddings=rotary)
    return target.lm_head(adapter.norm(hidden))


@pytest.mark.parametrize("reduced", [False, True], ids=["full_head", "reduced_head"])
def test_logits_equal_the_manual_computation(reduced):
    target = four_layer_model("llama")
    kept = torch.tensor([5, 17, 40, 41, 99, 127])
    adapter = perturbed_adapter(target, 2, head_tokens=kept if reduced else None)
    drafter = Recording(target, adapter)
    ids = left_padded([9], seed=4)[0]
    specdecode.generate(target, drafter, ids, num_draft_tokens=2, max_new_tokens=2)
    with torch.no_grad():
        manual = manual_logits(target, adapter, ids)[:, -1]
    first = drafter.seen[0].draft_logits[:, 0]
    if reduced:
        outside = torch.ones(128, dtype=torch.bool)
        outside[kept] = False
        assert torch.isneginf(first[:, outside]).all()
        torch.testing.assert_close(first[:, kept], manual[:, kept], rtol=1e-5, atol=1e-5)
        assert set(drafter.seen[0].draft_tokens.flatten().tolist()) <= set(kept.tolist())
    else:
        torch.testing.assert_close(first, manual, rtol=1e-5, atol=1e-5)


def test_shares_target_tensors_and_leaves_the_target_unchanged():
    target = four_layer_model("llama")
    ids = left_padded([6], seed=1)[0]
    with torch.no_grad():
        before = target(ids).logits.clone()
    target_tensors = {id(t) for t in list(target.parameters()) + list(target.buffers())}
    adapter = perturbed_adapter(target, 2)
    drafter = ExitAdapterDrafter(target, adapter)
    view = drafter.model
    adapter_tensors = {id(p) for p in adapter.parameters()}
    assert adapter_tensors and not adapter_tensors & target_tensors  # the adapter owns its weights
    for p in view.parameters():
        assert id(p) in target_tensors or id(p) in adapter_tensors  # nothing else was copied
    assert view.model.layers[0] is target.model.layers[0] and view.model.layers[2] is adapter.layer
    assert view.model.norm is adapter.norm and target.model.norm is not adapter.norm
    assert len(target.model.layers) == 4 and target.config.num_hidden_layers == 4
    with torch.no_grad():
        assert torch.equal(target(ids).logits, before)


def _sample(target, drafter, rule, n=N):
    ids = torch.tensor([PROMPT]).expand(n, -1)
    return specdecode.generate(target, drafter, ids, num_draft_tokens=2, rule=rule, do_sample=True,
                               max_new_tokens=K, eos_token_id=[], pad_token_id=PAD,
                               generator=torch.Generator().manual_seed(4))


class ClaimsMassOutsideTheHead:
    """Broken, mixed into a drafter class with a reduced head: drafts with the reduced head but
    hands over logits that give the tokens outside it the row's largest logit (a q that claims
    mass where nothing was ever drafted)."""

    def propose(self, state, num_tokens):
        proposal = super().propose(state, num_tokens)
        logits = proposal.draft_logits
        top = logits.amax(-1, keepdim=True).expand_as(logits)
        proposal.draft_logits = torch.where(torch.isneginf(logits), top, logits)
        return proposal


@pytest.mark.parametrize("rule", ["token", "block"])
def test_sampling_with_a_reduced_head_is_lossless_and_a_broken_variant_fails(sampling_pair, rule):
    target, _ = sampling_pair  # two layers, 8 tokens
    joint = exact_joint(target, PROMPT)
    adapter = perturbed_adapter(target, 1, head_tokens=torch.tensor([0, 2, 3, 4, 6, 7]), scale=0.3)
    out = _sample(target, ExitAdapterDrafter(target, adapter), rule)
    assert 0.1 < out.stats.acceptance_rate < 0.9
    new = out.sequences[:, len(PROMPT):]
    assert ((new == 1) | (new == 5)).any()  # tokens outside the head still come from the target
    assert chi_square_p(new, joint) > PASS_P
    if rule == "token":
        broken_class = type("BrokenExit", (ClaimsMassOutsideTheHead, ExitAdapterDrafter), {})
        broken = _sample(target, broken_class(target, adapter), rule, n=4000)
        assert chi_square_p(broken.sequences[:, len(PROMPT):], joint) < FAIL_P


def test_bad_arguments_are_refused():
    target = four_layer_model("llama")
    for bad in (0, 4, -1, True, 1.5):
        with pytest.raises(ValueError, match=r"exit_layer: expected an int in \[1, 3\]"):
            ExitAdapter.from_target(target, bad)
    with pytest.raises(ValueError, match="adapter: expected one of layer, linear"):
        ExitAdapter.from_target(target, 1, "mlp")
    with pytest.raises(TypeError, match="target"):
        ExitAdapter.from_target(torch.nn.Linear(2, 2), 1)
    adapter = ExitAdapter.from_target(target, 1)
    with pytest.raises(ValueError, match="head_token_ids"):
        adapter.set_head_tokens(torch.tensor([]))
    with pytest.raises(ValueError, match="head_token_ids"):
        adapter.set_head_tokens(torch.tensor([[1, 2]]))
    with pytest.raises(TypeError, match="adapter: expected an ExitAdapter"):
        ExitAdapterDrafter(target, "adapter")
    with pytest.raises(TypeError, match="target"):
        ExitAdapterDrafter(torch.nn.Linear(2, 2), adapter)
    small = make_model("llama", layers=2)
    with pytest.raises(ValueError, match="adapter: exit layer 3 does not fit"):
        ExitAdapterDrafter(small, ExitAdapter.from_target(target, 3))
    adapter.set_head_tokens(torch.tensor([1, 500]))
    with pytest.raises(ValueError, match="head_token_ids: ids must be below"):
        ExitAdapterDrafter(target, adapter)
