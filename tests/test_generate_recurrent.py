"""Recurrent and hybrid models (Mamba / Mamba2 mixers, gated delta rule, short convolutions)
on the eager path: a rejected draft leaves no trace in a recurrent state
(specdecode.engine.replay: states copied before verification, put back and the kept tokens fed
again). Tiny random models of seven hybrid families give the model's own greedy output, alone
and in ragged batches; the exact whole-loop sampling test passes for two rules and fails when
the states are not rolled back; what cannot run is refused naming the model type."""

from __future__ import annotations

import pytest
import torch
from test_generate_models import PAD, _one_thread, left_padded  # noqa: F401
from test_generate_sampling import K, chi_square_p, exact_joint
from test_generate_windows import alone, llama_draft

import specdecode.engine.loop as engine_loop
from specdecode import generate
from specdecode.drafters import NgramDrafter
from specdecode.models import kv_cache
from specdecode.trees.builders import DynamicTree

V = 96
PASS_P, FAIL_P = 1e-4, 1e-6


def hybrid_config(kind: str, vocab: int = V):
    import transformers as tf

    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, pad_token_id=PAD,
                  eos_token_id=1, bos_token_id=2)
    mamba2 = dict(mamba_n_heads=4, mamba_d_head=32, mamba_n_groups=1, mamba_d_state=16, mamba_chunk_size=8)
    if kind == "lfm2":
        return tf.Lfm2Config(layer_types=["conv", "full_attention", "conv"], **common)
    if kind == "qwen3_next":
        return tf.Qwen3NextConfig(layer_types=["linear_attention", "full_attention", "linear_attention"], head_dim=16,
                                  linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
                                  linear_value_head_dim=16, num_experts=4, num_experts_per_tok=2,
                                  moe_intermediate_size=32, shared_expert_intermediate_size=32, **common)
    if kind == "falcon_h1":
        return tf.FalconH1Config(mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=16,
                                 mamba_chunk_size=8, head_dim=16, **common)
    if kind == "granitemoehybrid":
        return tf.GraniteMoeHybridConfig(layer_types=["mamba", "attention", "mamba"], num_local_experts=2,
                                         num_experts_per_tok=1, shared_intermediate_size=32, **mamba2, **common)
    if kind == "bamba":
        return tf.BambaConfig(attn_layer_indices=[1], **mamba2, **common)
    if kind == "zamba2":
        return tf.Zamba2Config(mamba_d_state=16, mamba_headdim=32, n_mamba_heads=4, mamba_ngroups=1, chunk_size=8,
                               layers_block_type=["mamba", "hybrid", "mamba"], **common)
    if kind == "nemotron_h":
        return tf.NemotronHConfig(layers_block_type=["mamba", "attention", "mlp"], mamba_num_heads=4,
                                  mamba_head_dim=16, ssm_state_size=16, n_groups=1, chunk_size=8, **common)
    if kind == "jamba":
        return tf.JambaConfig(attn_layer_period=2, attn_layer_offset=1, expert_layer_period=4, num_experts=2,
                              mamba_d_state=8, mamba_dt_rank=8, **common)
    raise ValueError(kind)


HYBRIDS = ["lfm2", "qwen3_next", "falcon_h1", "granitemoehybrid", "bamba", "zamba2", "nemotron_h"]


def hybrid_model(kind: str, vocab: int = V, seed: int = 0, scale: float = 0.15):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hybrid_config(kind, vocab)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, scale)
    model.config.eos_token_id = model.generation_config.eos_token_id = None
    return model


@pytest.mark.parametrize("kind", HYBRIDS)
def test_greedy_equals_the_model_alone(kind):
    target = hybrid_model(kind)
    assert kv_cache.has_recurrent_layers(target)
    ids = torch.randint(3, V, (1, 20), generator=torch.Generator().manual_seed(1))
    want = alone(target, ids, torch.ones_like(ids), 24)
    for draft in (llama_draft(), NgramDrafter()):
        out = generate(target, draft, ids, max_new_tokens=24, num_draft_tokens=4, tree=None, eos_token_id=[],
                       pad_token_id=PAD)
        assert torch.equal(out.sequences[:, 20:], want), type(draft).__name__
        assert out.stats.accepted_tokens < out.stats.drafted_tokens  # rejections happened: states were rolled back


@pytest.mark.parametrize("kind", ["qwen3_next", "falcon_h1"])
def test_ragged_batches(kind):
    target = hybrid_model(kind)
    ids, mask = left_padded([14, 9, 11], vocab=V, seed=2)
    out = generate(target, llama_draft(), ids, mask, max_new_tokens=16, num_draft_tokens=3, tree=None,
                   eos_token_id=[], pad_token_id=PAD)
    assert torch.equal(out.sequences[:, ids.shape[1]:], alone(target, ids, mask, 16))


def test_rows_that_finish_leave_the_recurrent_states():
    target = hybrid_model("bamba")
    ids, mask = left_padded([10, 7], vocab=V, seed=3)
    want = alone(target, ids, mask, 16)
    eos = int(want[0, 5])  # row 0 stops early, row 1 goes on (unless it emits the same token first)
    out = generate(target, llama_draft(), ids, mask, max_new_tokens=16, num_draft_tokens=3, tree=None,
                   eos_token_id=eos, pad_token_id=PAD)
    for row in range(2):
        got, ref = out.sequences[row, ids.shape[1]:].tolist(), want[row].tolist()
        stop = ref.index(eos) + 1 if eos in ref else len(ref)
        assert got[:stop] == ref[:stop]


# ---------------------------------------------------------------------------- sampling exactness

PROMPT = [3, 5, 2, 7]


@pytest.fixture(scope="module")
def recurrent_pair():
    """LFM2 (short convolutions + attention: its convolution state is the recurrent one)."""
    return hybrid_model("lfm2", vocab=8, seed=4, scale=0.3), llama_draft(vocab=8, seed=5)


def _sample(target, draft, rule, n=20000):
    ids = torch.tensor([PROMPT]).expand(n, -1)
    out = generate(target, draft, ids, num_draft_tokens=2, rule=rule, do_sample=True, max_new_tokens=K, tree=None,
                   eos_token_id=[], pad_token_id=PAD, generator=torch.Generator().manual_seed(0))
    return out.sequences[:, len(PROMPT):]


@pytest.mark.parametrize("rule", ["token", "block"])
def test_sampling_is_exact(recurrent_pair, rule):
    target, draft = recurrent_pair
    assert chi_square_p(_sample(target, draft, rule), exact_joint(target, PROMPT)) > PASS_P


def test_sampling_is_exact_gated_delta_rule():
    """Qwen3-Next's gated-delta layers (fewer samples: its reference kernel is slow)."""
    target, draft = hybrid_model("qwen3_next", vocab=8, seed=4, scale=0.3), llama_draft(vocab=8, seed=5)
    assert chi_square_p(_sample(target, draft, "token", n=4000), exact_joint(target, PROMPT)) > PASS_P


def test_sampling_without_rollback_fails(recurrent_pair, monkeypatch):
    """Broken: the states keep what the rejected drafts wrote (only the attention layers crop)."""
    target, draft = recurrent_pair
    monkeypatch.setattr(engine_loop.SpeculativeEngine, "_replay", lambda self, pending, accepted: None)
    assert chi_square_p(_sample(target, draft, "token"), exact_joint(target, PROMPT)) < FAIL_P


def test_sampling_keeping_tied_rows_own_tokens_fails(recurrent_pair, monkeypatch):
    """Broken: every row that accepted the fewest drafts keeps the rule's next token (the cut
    then depends on the row's own rejection)."""
    import specdecode.engine.replay as replay

    def tied_keep(tokens, accepted_len, common, target_logits, sampling, uniforms):
        fresh = replay.sample_logits(target_logits[:, common], sampling, uniforms=uniforms)
        tokens = tokens.clone()
        tokens[:, common] = torch.where(accepted_len == common, tokens[:, common], fresh)
        return tokens, torch.full_like(accepted_len, common)

    monkeypatch.setattr(engine_loop, "common_acceptance", tied_keep)
    target, draft = recurrent_pair
    assert chi_square_p(_sample(target, draft, "token"), exact_joint(target, PROMPT)) < FAIL_P


# ---------------------------------------------------------------------------- refusals


def test_what_cannot_run_is_refused_naming_it():
    target = hybrid_model("qwen3_next")
    ids = torch.randint(3, V, (1, 8), generator=torch.Generator().manual_seed(6))
    with pytest.raises(ValueError, match=r"tree: .*qwen3_next.*recurrent"):
        generate(target, llama_draft(), ids, max_new_tokens=8, tree=DynamicTree(6, 3, top_k=2, calibrated=False),
                 eos_token_id=[], pad_token_id=PAD)
    with pytest.raises(ValueError, match=r"model: .*\(qwen3_next\) has recurrent layers; a draft model"):
        generate(llama_draft(), target, ids, max_new_tokens=8, eos_token_id=[], pad_token_id=PAD)
    jamba = hybrid_model("jamba")  # its Mamba mixers restart on a multi-token forward from a cache (static: stepped)
    with pytest.raises(ValueError, match=r"target: .*\(jamba\) cannot verify drafts: it has recurrent layers.*"
                                         r"decode_path='static' runs it"):
        generate(jamba, NgramDrafter(), ids, max_new_tokens=8, eos_token_id=[], pad_token_id=PAD)


# ---------------------------------------------------------------------------- other decoders


def test_models_that_cannot_verify_drafts_are_refused_naming_why():
    """Found by the forward probe (facts.forward_problem) rather than giving a silent wrong answer:
    an encoder loaded as a causal LM without is_decoder=True attends both ways, GPT-1 keeps no cache."""
    import transformers as tf

    torch.manual_seed(0)
    roberta = tf.RobertaForCausalLM(tf.RobertaConfig(vocab_size=V, hidden_size=32, num_hidden_layers=1,
                                                     num_attention_heads=2, intermediate_size=64,
                                                     pad_token_id=PAD)).eval()
    gpt1 = tf.OpenAIGPTLMHeadModel(tf.OpenAIGPTConfig(vocab_size=V, n_embd=32, n_layer=1, n_head=2)).eval()
    with torch.no_grad():  # weights of a trained model's size: later tokens matter
        for p in (*roberta.parameters(), *gpt1.parameters()):
            if p.dim() > 1:
                p.normal_(0, 0.2)
    ids = torch.randint(3, V, (1, 8), generator=torch.Generator().manual_seed(7))
    for model, why in ((roberta, "not causal"), (gpt1, "does not continue from its KV cache")):
        for path in ("eager", "static"):
            with pytest.raises(ValueError, match=rf"target: .*cannot verify drafts: .*{why}"):
                generate(model, NgramDrafter() if path == "eager" else None, ids, max_new_tokens=6, eos_token_id=[],
                         pad_token_id=PAD, decode_path=path)
    torch.manual_seed(0)  # the same encoder as a decoder: causal, cached, exact
    decoder = tf.RobertaForCausalLM(tf.RobertaConfig(vocab_size=V, hidden_size=32, num_hidden_layers=1,
                                                     num_attention_heads=2, intermediate_size=64, is_decoder=True,
                                                     pad_token_id=PAD)).eval()
    decoder.generation_config.eos_token_id = None
    out = generate(decoder, NgramDrafter(), ids, max_new_tokens=10, eos_token_id=[], pad_token_id=PAD)
    assert torch.equal(out.sequences[:, 8:], alone(decoder, ids, torch.ones_like(ids), 10))
