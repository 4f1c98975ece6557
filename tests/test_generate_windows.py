"""Sliding-window, chunked and sink attention on every decode path (specdecode.models.layer_masks).

Tiny random models of the families that mix layer types (window 6, far shorter than prompt
plus generation): greedy output equals the model's own ``generate`` of each row alone, on the
eager and static paths, chains and trees, ragged batches; the mask builder against a
definition by positions; and the exact whole-loop sampling test on a model whose window is
shorter than the tested context, which a loop that ignores the window fails."""

from __future__ import annotations

import pytest
import torch
from test_generate_models import PAD, _one_thread, left_padded  # noqa: F401
from test_generate_sampling import K, chi_square_p, exact_joint

import specdecode
import specdecode.models.layer_masks as layer_masks
from specdecode import ModelDrafter, generate
from specdecode.drafters import NgramDrafter
from specdecode.engine import static_loop
from specdecode.engine.static_layouts import kept_layouts

V = 96
WINDOW = 6
PASS_P, FAIL_P = 1e-4, 1e-6


def family_config(kind: str, vocab: int = V, window: int = WINDOW, layers: int = 3):
    import transformers as tf

    common = dict(vocab_size=vocab, hidden_size=48, intermediate_size=96, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, pad_token_id=PAD,
                  eos_token_id=1, bos_token_id=2)
    mixed = ["sliding_attention", "full_attention", "sliding_attention"][:layers]
    if kind == "mistral":
        return tf.MistralConfig(sliding_window=window, **common)
    if kind == "phi3":
        return tf.Phi3Config(sliding_window=window, **common)
    if kind == "qwen2":
        return tf.Qwen2Config(use_sliding_window=True, sliding_window=window, max_window_layers=1, **common)
    if kind == "gemma2":
        return tf.Gemma2Config(sliding_window=window, head_dim=12, layer_types=mixed, **common)
    if kind == "gemma3_text":
        return tf.Gemma3TextConfig(sliding_window=window, head_dim=12, layer_types=mixed, **common)
    if kind == "cohere2":
        return tf.Cohere2Config(sliding_window=window, layer_types=mixed, **common)
    if kind == "gpt_oss":
        return tf.GptOssConfig(sliding_window=window, layer_types=mixed, num_local_experts=4, num_experts_per_tok=2,
                               head_dim=12, **common)
    if kind == "llama4":
        return tf.Llama4TextConfig(attention_chunk_size=window, num_local_experts=2, interleave_moe_layer_step=1,
                                   intermediate_size_mlp=96, head_dim=12, no_rope_layers=[1, 1, 0][:layers],
                                   **common)
    raise ValueError(kind)


# gemma2 and gpt-oss attend through the eager implementation (softcapping, sinks)
IMPLEMENTATION = {"gemma2": "eager", "gpt_oss": "eager"}
FAMILIES = ["mistral", "phi3", "qwen2", "gemma2", "gemma3_text", "cohere2", "gpt_oss", "llama4"]


def family_model(kind: str, seed: int = 0, scale: float = 0.2, **kwargs):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(family_config(kind, **kwargs),
                                             attn_implementation=IMPLEMENTATION.get(kind, "sdpa")).eval()
    with torch.no_grad():  # larger weights than the default: distinct, context-dependent greedy choices
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, scale)
    model.config.eos_token_id = model.generation_config.eos_token_id = None  # every row runs to its length
    return model


def llama_draft(vocab: int = V, seed: int = 1):
    import transformers as tf

    torch.manual_seed(seed)
    config = tf.LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                            num_attention_heads=2, num_key_value_heads=1, pad_token_id=PAD, eos_token_id=1,
                            bos_token_id=2)
    return tf.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()


def alone(target, ids, mask, max_new_tokens):
    """Each row's greedy continuation by the model's own generate, the row alone and unpadded."""
    rows = []
    for row in range(ids.shape[0]):
        prompt = ids[row: row + 1, mask[row].bool()]
        rows.append(target.generate(prompt, do_sample=False, max_new_tokens=max_new_tokens,
                                    pad_token_id=PAD)[0, prompt.shape[1]:])
    return torch.stack(rows)


@pytest.fixture(autouse=True)
def _fresh_sessions():
    static_loop.clear_static_sessions()
    yield
    static_loop.clear_static_sessions()


# ---------------------------------------------------------------------------- the masks


def test_layouts_of_the_families():
    assert layer_masks.layout(llama_draft()) is None
    mistral = layer_masks.layout(family_model("mistral"))
    assert mistral.windows == {"sliding_attention": WINDOW} and not mistral.mapping
    gemma = layer_masks.layout(family_model("gemma3_text"))
    assert gemma.windows == {"sliding_attention": WINDOW, "full_attention": None} and gemma.mapping
    assert layer_masks.layout(family_model("llama4")).chunk == WINDOW


def _by_positions(key_pos, query_pos, real, causal, window=None, chunk=None):
    """The definition: a query sees the real keys before it, within ``window`` positions, in
    its ``chunk``."""
    keep = real & causal
    if window is not None:
        keep = keep & (query_pos[..., None] - key_pos[..., None, :] < window)
    if chunk is not None:
        keep = keep & (query_pos[..., None] // chunk == key_pos[..., None, :] // chunk)
    return keep


@pytest.mark.parametrize("seed", range(4))
def test_masks_follow_positions_through_holes(seed):
    """A ragged layout (left padding, holes where drafts were rejected): the windowed and
    chunked masks equal the definition by each row's own positions."""
    g = torch.Generator().manual_seed(seed)
    B, T, n = 3, 23, 5
    real = torch.rand(B, T, generator=g) > 0.3
    real[:, -n:] = True
    positions = (real.long().cumsum(1) - 1).clamp_min(0)
    model = family_model("llama4")  # chunked and full layers
    masks = layer_masks.layer_masks(model, real.long(), positions[:, -n:], T)
    causal = torch.arange(T)[None, :] <= (T - n + torch.arange(n))[:, None]
    for kind, chunk in (("chunked_attention", WINDOW), ("full_attention", None)):
        want = _by_positions(positions, positions[:, -n:], real[:, None, :], causal[None], chunk=chunk)
        assert torch.equal(masks[kind][:, 0] == 0, want)
    sliding = layer_masks.layer_masks(family_model("mistral", layers=1), real.long(), positions[:, -n:], T)
    want = _by_positions(positions, positions[:, -n:], real[:, None, :], causal[None], window=WINDOW)
    assert torch.equal(sliding[:, 0] == 0, want)


def test_tree_masks_count_ancestors_only():
    """A tree's nodes at one depth sit side by side: a node's window counts its ancestors, not
    its siblings' columns."""
    prefix, nodes = 8, 4  # root, two children of the root, one grandchild under the second
    ancestors = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    allowed = torch.cat([torch.ones(nodes, prefix, dtype=torch.bool), ancestors], 1)[None, None]
    positions = torch.tensor([[prefix, prefix + 1, prefix + 1, prefix + 2]])
    mask = layer_masks.layer_masks(family_model("mistral", layers=1), allowed, positions, prefix + nodes)[0, 0] == 0
    key_pos = torch.cat([torch.arange(prefix), positions[0]])
    want = allowed[0, 0] & (positions[0][:, None] - key_pos[None, :] < WINDOW)
    assert torch.equal(mask, want)


# ---------------------------------------------------------------------------- greedy identity


@pytest.mark.parametrize("kind", FAMILIES)
def test_greedy_beyond_the_window_eager_and_static(kind):
    target, draft = family_model(kind), llama_draft()
    ids, mask = left_padded([20, 13, 17], vocab=V, seed=4)
    want = alone(target, ids, mask, 24)
    for decode_path in ("eager", "static"):
        for tree in (None, "auto"):
            out = generate(target, ModelDrafter(draft), ids, mask, max_new_tokens=24, num_draft_tokens=4, tree=tree,
                           eos_token_id=[], pad_token_id=PAD, decode_path=decode_path)
            assert torch.equal(out.sequences[:, ids.shape[1]:], want), (decode_path, tree)


@pytest.mark.parametrize("kind", ["gemma3_text", "gpt_oss"])
def test_greedy_beyond_the_window_prompt_lookup_batch_of_one(kind):
    target = family_model(kind)
    ids = torch.randint(3, V, (1, 30), generator=torch.Generator().manual_seed(5))
    want = alone(target, ids, torch.ones_like(ids), 40)
    out = generate(target, NgramDrafter(), ids, max_new_tokens=40, eos_token_id=[], pad_token_id=PAD)
    assert torch.equal(out.sequences[:, 30:], want)


def test_a_draft_model_with_a_window_drafts_past_it():
    """The draft model's own sliding layers are masked the same way (it used to cap the
    generation at its window)."""
    target, draft = family_model("gemma3_text"), family_model("mistral", seed=3, layers=1)
    ids = torch.randint(3, V, (1, 12), generator=torch.Generator().manual_seed(6))
    out = generate(target, draft, ids, max_new_tokens=30, num_draft_tokens=3, eos_token_id=[], pad_token_id=PAD)
    assert torch.equal(out.sequences[:, 12:], alone(target, ids, torch.ones_like(ids), 30))


# ---------------------------------------------------------------------------- sampling exactness

PROMPT = [3, 5, 2, 7, 4]


@pytest.fixture(scope="module")
def windowed_pair():
    """A Gemma-3 target whose sliding layers see 3 tokens (the tested context is 8), and a
    one-layer Llama draft, over a vocabulary of 8."""
    target = family_model("gemma3_text", vocab=8, window=3, seed=2, scale=0.12)
    return target, llama_draft(vocab=8, seed=3)


def _sample(target, draft, **kwargs):
    n = 20000
    ids = torch.tensor([PROMPT]).expand(n, -1)
    out = generate(target, ModelDrafter(draft), ids, num_draft_tokens=2, do_sample=True, max_new_tokens=K,
                   eos_token_id=[], pad_token_id=PAD, generator=torch.Generator().manual_seed(0), **kwargs)
    return out.sequences[:, len(PROMPT):]


def test_sampling_is_exact_beyond_the_window(windowed_pair, monkeypatch):
    target, draft = windowed_pair
    joint = exact_joint(target, PROMPT)  # the model's own forwards, its own masks
    assert chi_square_p(_sample(target, draft), joint) > PASS_P
    # broken: the sliding layers see the whole context (the window ignored)
    real_layout = layer_masks.layout

    def no_window(model):
        info = real_layout(model)
        if info is None:
            return None
        return layer_masks.LayerLayout(windows={k: None for k in info.windows}, chunk=None, mapping=info.mapping,
                                       other_types=info.other_types)

    monkeypatch.setattr(layer_masks, "layout", no_window)
    assert chi_square_p(_sample(target, draft), joint) < FAIL_P


def test_sampling_is_exact_beyond_the_window_static(windowed_pair):
    target, draft = windowed_pair
    joint = exact_joint(target, PROMPT)
    assert chi_square_p(_sample(target, draft, decode_path="static"), joint) > PASS_P


def test_cpu_fast_path_keeps_the_windows():
    target, draft = family_model("gemma3_text"), llama_draft()
    ids = torch.randint(3, V, (1, 25), generator=torch.Generator().manual_seed(8))
    want = alone(target, ids, torch.ones_like(ids), 20)
    with specdecode.cpu.accelerated(target):
        out = generate(target, draft, ids, max_new_tokens=20, num_draft_tokens=4, eos_token_id=[], pad_token_id=PAD)
    assert torch.equal(out.sequences[:, 25:], want)


# ---------------------------------------------------------------------------- static memory


def test_static_sliding_layers_keep_a_ring():
    """On the static path a sliding layer keeps its window plus one step's draft columns, a full
    layer the whole capacity; the output stays the model's own past the window, chains
    and trees."""
    target, draft = family_model("gemma3_text"), llama_draft()
    ids, mask = left_padded([30, 22], vocab=V, seed=9)
    want = alone(target, ids, mask, 30)
    for tree, span in ((None, 4), ("auto", None)):
        out = generate(target, ModelDrafter(draft), ids, mask, max_new_tokens=30, num_draft_tokens=4, tree=tree,
                       eos_token_id=[], pad_token_id=PAD, decode_path="static")
        assert torch.equal(out.sequences[:, ids.shape[1]:], want), tree
        (session,) = kept_layouts(target)
        cache = session.cache
        sliding = [i for i, kind in enumerate(target.config.layer_types) if kind == "sliding_attention"]
        rings = {cache.keys[i].shape[2] for i in sliding}
        assert len(rings) == 1
        ring = rings.pop()
        assert ring == WINDOW + span if span is not None else WINDOW + 1 <= ring < cache.capacity
        assert all(cache.keys[i].shape[2] == cache.capacity for i in range(3) if i not in sliding)
        static_loop.clear_static_sessions()


def test_a_ring_too_small_for_a_step_is_caught(monkeypatch):
    """Broken: a ring one step's columns short. Stale keys of rejected drafts then sit inside
    the window, and the output leaves the model's own."""
    import specdecode.models.layer_masks as masks_module

    real = masks_module.ring_sizes
    monkeypatch.setattr(masks_module, "ring_sizes", lambda model, span, capacity: {
        i: r - span for i, r in real(model, span, capacity).items()})
    target, draft = family_model("mistral"), llama_draft()
    ids = torch.randint(3, V, (1, 20), generator=torch.Generator().manual_seed(10))
    out = generate(target, ModelDrafter(draft), ids, max_new_tokens=30, num_draft_tokens=4, eos_token_id=[],
                   pad_token_id=PAD, decode_path="static")
    assert not torch.equal(out.sequences[:, 20:], alone(target, ids, torch.ones_like(ids), 30))


def test_a_window_the_model_never_applies_is_not_masked():
    """A config may carry a window that only flash attention reads (Moshi's): a model whose
    module never builds sliding masks attends over everything, and so do its masks here."""
    model = llama_draft()
    model.config.sliding_window = 4
    assert layer_masks.layout(model) is None
    assert layer_masks.layout(family_model("mistral", layers=1)) is not None
