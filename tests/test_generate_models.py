"""Tiny random-weight model pairs for the generation tests (no downloads), plus their own
sanity checks. A "pair" is a 2-layer target and a 1-layer draft of the same architecture that
shares the target's embeddings, first layer and head, so that the draft agrees with the target
often but not always (a realistic mix of accepted and rejected drafts)."""

from __future__ import annotations

import pytest
import torch

PAD, EOS, BOS = 0, 1, 2
ARCHS = ["gpt2", "llama", "qwen2", "mistral", "gpt_neox", "opt", "gemma", "phi"]
# Weight scales that give each architecture's truncated draft a mix of accepted and rejected
# tokens (tied-embedding models at 0.02 just repeat their last token).
INIT = {"gpt2": 0.08, "gemma": 0.2, "opt": 0.05}


def make_config(arch: str, vocab: int = 128, layers: int = 2, init: float = 0.02, hidden: int = 48, **overrides):
    config = _base_config(arch, vocab, layers, init, hidden)
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def _base_config(arch: str, vocab: int, layers: int, init: float, hidden: int):
    import transformers as tf

    common = dict(vocab_size=vocab, pad_token_id=PAD, eos_token_id=EOS, bos_token_id=BOS, initializer_range=init)
    if arch == "gpt2":
        return tf.GPT2Config(n_embd=hidden, n_layer=layers, n_head=4, n_positions=256, **common)
    if arch == "llama":
        return tf.LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                              tie_word_embeddings=False, **common)
    if arch == "qwen2":
        return tf.Qwen2Config(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                              use_sliding_window=False, tie_word_embeddings=False, **common)
    if arch == "mistral":
        return tf.MistralConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                sliding_window=None, tie_word_embeddings=False, **common)
    if arch == "gpt_neox":
        return tf.GPTNeoXConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                                num_attention_heads=4, max_position_embeddings=256, rotary_pct=0.5,
                                tie_word_embeddings=False, **common)
    if arch == "opt":
        return tf.OPTConfig(hidden_size=hidden, ffn_dim=2 * hidden, num_hidden_layers=layers, num_attention_heads=4,
                            word_embed_proj_dim=hidden, max_position_embeddings=256, **common)
    if arch == "gemma":
        return tf.GemmaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=12, max_position_embeddings=256,
                              **common)
    if arch == "phi":
        return tf.PhiConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                            num_attention_heads=4, max_position_embeddings=256, partial_rotary_factor=0.5,
                            **common)
    raise ValueError(arch)


def make_model(arch: str, seed: int = 0, **config_kwargs):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(make_config(arch, **config_kwargs), attn_implementation="sdpa").eval()


def make_pair(arch: str, seed: int = 0, vocab: int = 128, init: float | None = None, draft_vocab: int | None = None,
              **overrides):
    """(target, draft): the draft is the target's first layer (and embeddings, final norm, head)."""
    init = INIT.get(arch, 0.02) if init is None else init
    target = make_model(arch, seed=seed, vocab=vocab, init=init, **overrides)
    draft = make_model(arch, seed=seed + 1, vocab=draft_vocab or vocab, layers=1, init=init, **overrides)
    state = target.state_dict()
    own = draft.state_dict()
    shared = {}
    for k, v in state.items():
        if k not in own:
            continue
        if own[k].shape == v.shape:
            shared[k] = v
        elif own[k].dim() >= 1 and own[k].shape[1:] == v.shape[1:]:  # vocab rows of a padded pair
            n = min(own[k].shape[0], v.shape[0])
            w = own[k].clone()
            w[:n] = v[:n]
            shared[k] = w
    draft.load_state_dict(shared, strict=False)
    return target, draft


def left_padded(lengths: list[int], vocab: int = 128, seed: int = 0, pad: int = PAD):
    """A left-padded batch of random prompts (ids >= 3, so no pad / eos / bos inside)."""
    g = torch.Generator().manual_seed(seed)
    L = max(lengths)
    ids = torch.full((len(lengths), L), pad, dtype=torch.long)
    mask = torch.zeros((len(lengths), L), dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, L - n:] = torch.randint(3, vocab, (n,), generator=g)
        mask[i, L - n:] = 1
    return ids, mask


@pytest.fixture(autouse=True)
def _one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.mark.parametrize("arch", ARCHS)
def test_pair_builds_and_runs(arch):
    target, draft = make_pair(arch)
    ids, mask = left_padded([3, 5])
    with torch.no_grad():
        assert target(ids, attention_mask=mask).logits.shape == (2, 5, 128)
        assert draft(ids, attention_mask=mask).logits.shape == (2, 5, 128)
    assert len(list(draft.parameters())) < len(list(target.parameters()))
