"""Gemma4AssistantDrafter on tiny random Gemma 4 models (float32, text only): greedy output is the
target's own and Hugging Face's assisted generation's (chains and rank-path trees, batch 1 and a
left-padded batch), the first proposal equals transformers' own candidate generator's, every
proposal's logits equal a from-scratch reference through rejections, re-packs and finished rows,
sampling stays lossless at T = 1 while Hugging Face's way of drafting (the argmax, verified
against the assistant's distribution) fails the same test, and bad arguments are refused by name."""

from __future__ import annotations

import pytest
import torch
from drafter_harness import checking, greedy_equals_target, repack_often, sampled_p
from test_generate_models import PAD, left_padded
from test_generate_sampling import FAIL_P, PASS_P, PROMPT, V, exact_joint
from test_static_features import guard_static_propose

import specdecode
from specdecode.drafters.gemma4_assistant import Gemma4AssistantDrafter, producer_layers
from specdecode.drafters.medusa import product_tree

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Gemma4AssistantForCausalLM"):  # pragma: no cover - older transformers
    pytest.skip("transformers has no Gemma 4 assistant", allow_module_level=True)
from transformers import (Gemma4AssistantConfig, Gemma4AssistantForCausalLM,  # noqa: E402
                          Gemma4ForCausalLM, Gemma4TextConfig)

HIDDEN, WINDOW = 32, 5


def text_config(vocab: int, layers: int, hidden: int, types: list[str], shared: int, per_layer: int) -> Gemma4TextConfig:
    return Gemma4TextConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=40, num_hidden_layers=layers,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=8, global_head_dim=16,
                            sliding_window=WINDOW, layer_types=types, num_kv_shared_layers=shared,
                            hidden_size_per_layer_input=per_layer, vocab_size_per_layer_input=vocab if per_layer else 0,
                            pad_token_id=PAD, eos_token_id=1, bos_token_id=2, max_position_embeddings=256)


def make_target(vocab: int = 111, seed: int = 0, scale: float = 1.0) -> Gemma4ForCausalLM:
    """Five layers (sliding, full, sliding, then two that reuse the producers' keys/values) with
    per-layer inputs, as Gemma 4's small models."""
    types = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    torch.manual_seed(seed)
    model = Gemma4ForCausalLM(text_config(vocab, 5, HIDDEN, types, shared=2, per_layer=4)).eval()
    _scale(model, scale)
    return model


def make_assistant(vocab: int = 111, seed: int = 1, scale: float = 1.0, ordered: bool = False
                   ) -> Gemma4AssistantForCausalLM:
    text = text_config(vocab, 2, 24, ["sliding_attention", "full_attention"], shared=2, per_layer=0)
    extra = {"use_ordered_embeddings": True, "num_centroids": 3, "centroid_intermediate_top_k": 2} if ordered else {}
    torch.manual_seed(seed)
    model = Gemma4AssistantForCausalLM(Gemma4AssistantConfig(text_config=text, backbone_hidden_size=HIDDEN, **extra))
    if ordered:
        model.masked_embedding.token_ordering.copy_(torch.randperm(vocab, generator=torch.Generator().manual_seed(5)))
    _scale(model, scale)
    model.generation_config.num_assistant_tokens = 3
    return model.eval()


def _scale(model: torch.nn.Module, scale: float) -> None:
    if scale != 1.0:
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(scale)


@pytest.fixture(scope="module")
def pair():
    return make_target(), make_assistant()


# ------------------------------------------------------------------------ greedy


@pytest.mark.parametrize("tree", [None, product_tree([2, 2, 1])])
def test_greedy_equals_the_target_and_hf_assisted_generation(pair, tree):
    target, assistant = pair
    drafter = Gemma4AssistantDrafter(assistant, target, tree=tree)
    hf = dict(max_new_tokens=16, eos_token_id=[], pad_token_id=PAD)
    one = left_padded([9], vocab=111, seed=2)[0]
    out = greedy_equals_target(target, drafter, one, hf=hf, num_draft_tokens=3)
    assert out.stats.drafter == "gemma4_assistant" and out.stats.draft_calls > 0
    assisted = target.generate(one, attention_mask=torch.ones_like(one), assistant_model=assistant, do_sample=False,
                               **hf)
    assert torch.equal(assisted, out.sequences)  # HF assisted: batch 1 only
    ids, mask = left_padded([5, 9, 2], vocab=111, seed=3)
    greedy_equals_target(target, drafter, ids, mask, hf=hf, num_draft_tokens=3)


def test_first_proposal_equals_transformers_candidate_generator(pair):
    """The same committed context (the prompt, then its greedy next token pending): our first
    chain equals SinglePositionMultiTokenCandidateGenerator's candidates and logits."""
    from transformers import GenerationConfig
    from transformers.generation.candidate_generator import SinglePositionMultiTokenCandidateGenerator

    target, assistant = pair
    prompt = left_padded([11], vocab=111, seed=4)[0]  # longer than the window: the sliding mask matters
    with torch.no_grad():
        out = target(prompt, output_hidden_states=True, return_shared_kv_states=True)
    ids = torch.cat([prompt, out.logits[:, -1:].argmax(-1)], 1)
    hf = SinglePositionMultiTokenCandidateGenerator(assistant, target.get_input_embeddings(),
                                                    GenerationConfig(max_length=64))
    want_ids, want_logits = hf.get_candidates(ids, model_kwargs={"attention_mask": torch.ones_like(ids)},
                                              model_outputs=out, is_first_iteration=False, n_last_matches=0)
    seen = []

    class Spy(Gemma4AssistantDrafter):
        def propose(self, state, num_tokens):
            proposal = super().propose(state, num_tokens)
            seen.append(proposal)
            return proposal

    specdecode.generate(target, Spy(assistant, target), ids, num_draft_tokens=3, max_new_tokens=8, eos_token_id=[],
                        draft_schedule="constant")
    assert torch.equal(seen[0].draft_tokens, want_ids[:, ids.shape[1]:])
    torch.testing.assert_close(seen[0].draft_logits, want_logits, rtol=1e-4, atol=1e-4)


def reference_chain(target, assistant, context: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """The assistant's logits along ``drafts`` for one row from its real tokens (the pending one
    last), from scratch with Hugging Face's modules: the target over the committed tokens, then
    the assistant on its shared key/value states. Shape: returns ``[len(drafts), V]``."""
    n = len(context)
    out = target(context[None, :-1], output_hidden_states=True, return_shared_kv_states=True)
    hidden, token = out.hidden_states[-1][:, -1:], context[None, -1:]
    logits = []
    for j in range(len(drafts)):
        embeds = torch.cat([target.get_input_embeddings()(token), hidden], -1)
        step = assistant(inputs_embeds=embeds, attention_mask=torch.ones((1, n - 1), dtype=torch.long),
                         position_ids=torch.tensor([[n - 1]]), shared_kv_states=out.shared_kv_states)
        logits.append(step.logits[0, 0])
        hidden, token = step.last_hidden_state, drafts[None, j: j + 1]
    return torch.stack(logits)


def leaning_pair():
    """7-token models that both lean to token 5: drafts accepted about a fifth of the time."""
    target, assistant = make_target(vocab=7, seed=5, scale=1.5), make_assistant(vocab=7, seed=6, scale=1.5)
    with torch.no_grad():
        target.get_input_embeddings().weight[5] *= 4
        assistant.lm_head.weight[5] *= 4
    return target, assistant


def check_row(drafter, proposal, r, context) -> bool:
    """A chain proposal's row ``r`` against :func:`reference_chain` (trees: not checked)."""
    if proposal.draft_logits is None or not proposal.num_tokens:
        return False
    want = reference_chain(drafter.target, drafter.assistant_model, context, proposal.draft_tokens[r])
    torch.testing.assert_close(proposal.draft_logits[r], want, rtol=1e-4, atol=1e-4)
    return True


Checking = checking(Gemma4AssistantDrafter, check_row)


def test_logits_equal_a_from_scratch_reference(monkeypatch):
    """7-token models: rows accept different lengths, leave early (EOS) and get re-packed;
    every proposal still equals the reference, and the output is the target's."""
    repack_often(monkeypatch)
    target, assistant = leaning_pair()
    ids, mask = left_padded([5, 9, 2], vocab=7, seed=4)
    drafter = Checking(assistant, target)
    hf = dict(max_new_tokens=20, eos_token_id=[6], pad_token_id=PAD)
    out = greedy_equals_target(target, drafter, ids, mask, hf=hf, num_draft_tokens=3)
    assert drafter.checked > 10 and 0.0 < out.stats.acceptance_rate < 1.0
    assert out.stats.repacks > 0


def test_ordered_embeddings_head_equals_transformers(pair):
    """An assistant with ordered embeddings (centroid-masked logits) drafts what its own forward gives."""
    target, _ = pair
    assistant = make_assistant(ordered=True, scale=2.0)
    prompt = left_padded([8], vocab=111, seed=6)[0]
    drafter = Checking(assistant, target)
    greedy_equals_target(target, drafter, prompt, hf=dict(max_new_tokens=6, eos_token_id=[], pad_token_id=PAD),
                         num_draft_tokens=2)
    assert drafter.checked > 0


@pytest.mark.parametrize("tree", [None, product_tree([2, 1])])
def test_static_path_drafts_what_the_eager_path_drafts(tree):
    """Greedy on the static path: the target's output, the eager path's acceptance (the same
    drafts), rows finishing early; static_propose reads no tensor on the host."""
    target, assistant = leaning_pair()
    ids, mask = left_padded([5, 9, 2], vocab=7, seed=4)
    runs = {}
    for path in ("eager", "static"):
        drafter = Gemma4AssistantDrafter(assistant, target, tree=tree)
        calls = guard_static_propose(drafter) if tree is None else [0]
        runs[path] = greedy_equals_target(target, drafter, ids, mask, num_draft_tokens=3, decode_path=path,
                                          hf=dict(max_new_tokens=16, eos_token_id=[6], pad_token_id=PAD))
    assert runs["static"].stats.decode_path == "static"
    assert runs["eager"].stats.accepted_tokens == runs["static"].stats.accepted_tokens > 0
    assert tree is not None or calls[0] == runs["static"].stats.decode_steps_run > 0


# ------------------------------------------------------------------------ sampling exactness


@pytest.fixture(scope="module")
def sampling_pair():
    target, assistant = make_target(vocab=V, seed=4, scale=3.0), make_assistant(vocab=V, seed=5, scale=3.0)
    target.generation_config.eos_token_id = None
    return target, assistant, exact_joint(target, PROMPT)


@pytest.mark.parametrize("path", ["eager", "static"])
def test_sampled_chain_is_lossless(sampling_pair, path):
    target, assistant, joint = sampling_pair
    out, p = sampled_p(target, Gemma4AssistantDrafter(assistant, target), joint, n=10000, decode_path=path)
    assert 0.05 < out.stats.acceptance_rate < 0.95 and p > PASS_P


@pytest.mark.parametrize("path", ["eager", "static"])
def test_tree_is_lossless(sampling_pair, path):
    target, assistant, joint = sampling_pair
    drafter = Gemma4AssistantDrafter(assistant, target, tree=product_tree([2, 2]))
    out, p = sampled_p(target, drafter, joint, n=4000, decode_path=path)
    assert out.stats.tree_rule == "deterministic" and out.stats.accepted_tokens > 300 and p > PASS_P


class ArgmaxDrafts(Gemma4AssistantDrafter):
    """Broken, as Hugging Face's candidate generator drafts when it samples: the argmax of the
    assistant's distribution, verified against that distribution as if it had been sampled."""

    def propose(self, state, num_tokens):
        proposal = super().propose(state, num_tokens)
        if proposal.draft_logits is None or not proposal.num_tokens:
            return proposal
        pending = state.num_columns - 1
        feature, context, position, masks = self._start(state, pending)
        tokens, logits = self._argmax_chain(state.tokens[:, pending], feature, position, context, masks,
                                            proposal.num_tokens, state.vocab_size)
        return type(proposal)(tokens, logits, forward_calls=proposal.forward_calls)

    def static_propose(self, state, num_tokens):
        root, feature, position, context, masks = self._static_start(state, num_tokens + 1)
        return self._argmax_chain(root, feature, position, context, masks, num_tokens, state.vocab_size)

    def _argmax_chain(self, token, feature, position, context, masks, count, vocab_size):
        hidden, tokens, logits = feature[:, None], [], []
        for _ in range(count):
            step, hidden = self._assist(token[:, None], hidden, position, context, masks, vocab_size)
            token = step[:, 0].argmax(-1)
            tokens.append(token)
            logits.append(step[:, 0])
        return torch.stack(tokens, 1), torch.stack(logits, 1)


@pytest.mark.parametrize("path", ["eager", "static"])
def test_broken_variant_fails_the_same_test(sampling_pair, path):
    target, assistant, joint = sampling_pair
    _, p = sampled_p(target, ArgmaxDrafts(assistant, target), joint, n=4000, decode_path=path)
    assert p < FAIL_P


# ------------------------------------------------------------------------ arguments


def test_bad_arguments_are_refused(pair):
    from test_generate_models import make_model

    target, assistant = pair
    assert producer_layers(target) == {"sliding_attention": 2, "full_attention": 1}
    with pytest.raises(TypeError, match="assistant_model"):
        Gemma4AssistantDrafter(target, target)
    with pytest.raises(TypeError, match="assistant_model"):
        Gemma4AssistantDrafter("assistant", target)
    with pytest.raises(TypeError, match="target"):
        Gemma4AssistantDrafter(assistant, "target")
    with pytest.raises(ValueError, match="target: this Gemma4AssistantForCausalLM computes no key/value states"):
        Gemma4AssistantDrafter(assistant, assistant)
    with pytest.raises(ValueError, match="target: expected a Gemma 4 model"):
        Gemma4AssistantDrafter(assistant, make_model("llama", vocab=111))
    with pytest.raises(ValueError, match="assistant_model: drafts over 7 ids"):
        Gemma4AssistantDrafter(make_assistant(vocab=7), target)
    wide = make_target()
    wide_cfg = text_config(111, 5, 48, list(wide.config.layer_types), shared=2, per_layer=4)
    with pytest.raises(ValueError, match="assistant_model: built for a target of hidden size 32"):
        Gemma4AssistantDrafter(assistant, Gemma4ForCausalLM(wide_cfg))
    with pytest.raises(ValueError, match="tree"):
        Gemma4AssistantDrafter(assistant, target, tree=[(0, 0)])
    with pytest.raises(ValueError, match="tree_children"):
        Gemma4AssistantDrafter(assistant, target).with_tree([(0,)], tree_children="iid")
    ids = left_padded([4], vocab=111, seed=0)[0]
    with pytest.raises(ValueError, match="tree: a path asks for the rank-111"):
        specdecode.generate(target, Gemma4AssistantDrafter(assistant, target, tree=[(0,), (111,)]), ids,
                            max_new_tokens=4)
