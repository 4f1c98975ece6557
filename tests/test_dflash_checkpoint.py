"""Published DFlash checkpoints (``DFlashDraftModel`` folders, written here in that format for a
tiny Qwen3 target): the loaded drafter's greedy output is the target's (batch 1 and a left-padded
batch, eager and static), its block logits equal a reference written from the published
description, sharded weights and ``specdecode.load_drafter`` load it, the config variants read,
and bad folders or targets are refused by name."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from test_drafters import hf_greedy
from test_generate_models import BOS, EOS, PAD, left_padded

import specdecode
from specdecode.drafters import DFlashDrafter, load_dflash
from specdecode.drafters.dflash_checkpoint import is_dflash_checkpoint, read_dflash_config
from specdecode.drafters.dflash_model import default_target_layer_ids

H, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN, BLOCK, MASK = 48, 2, 4, 2, 12, 64, 4, 110
CONFIG = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": BLOCK,
          "dflash_config": {"mask_token_id": MASK, "target_layer_ids": [0, 2]}, "num_target_layers": 4,
          "hidden_size": H, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
          "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "intermediate_size": FFN, "rms_norm_eps": 1e-6,
          "rope_theta": 10000.0, "attention_bias": False, "vocab_size": 111, "tie_word_embeddings": False,
          "torch_dtype": "float32"}


def qwen3_target(hidden: int = H, seed: int = 0):
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=111, hidden_size=hidden, intermediate_size=96, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=12, max_position_embeddings=256,
                         tie_word_embeddings=False, initializer_range=0.1, pad_token_id=PAD, eos_token_id=EOS,
                         bos_token_id=BOS)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()


def draft_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    """Random draft weights under the published names (no embedding, no head)."""
    shapes = {"fc.weight": (H, 2 * H), "hidden_norm.weight": (H,), "norm.weight": (H,)}
    for i in range(LAYERS):
        attn, mlp = f"layers.{i}.self_attn.", f"layers.{i}.mlp."
        shapes |= {attn + "q_proj.weight": (HEADS * HEAD_DIM, H), attn + "k_proj.weight": (KV_HEADS * HEAD_DIM, H),
                   attn + "v_proj.weight": (KV_HEADS * HEAD_DIM, H), attn + "o_proj.weight": (H, HEADS * HEAD_DIM),
                   attn + "q_norm.weight": (HEAD_DIM,), attn + "k_norm.weight": (HEAD_DIM,),
                   f"layers.{i}.input_layernorm.weight": (H,), f"layers.{i}.post_attention_layernorm.weight": (H,),
                   mlp + "gate_proj.weight": (FFN, H), mlp + "up_proj.weight": (FFN, H), mlp + "down_proj.weight": (H, FFN)}
    g = torch.Generator().manual_seed(seed)
    return {k: 1 + 0.2 * torch.randn(s, generator=g) if len(s) == 1 else 1.5 * torch.randn(s, generator=g) / s[1] ** 0.5
            for k, s in shapes.items()}


WEIGHTS = draft_weights()


def write_checkpoint(folder, config=None, weights=None, shards: int = 0):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(CONFIG if config is None else config))
    weights = WEIGHTS if weights is None else weights
    if not shards:
        save_file(weights, str(folder / "model.safetensors"))
        return folder
    names, weight_map = sorted(weights), {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: weights[k] for k in names[s::shards]}
        save_file(part, str(folder / file))
        weight_map |= dict.fromkeys(part, file)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def variant(**changes) -> dict:
    config = json.loads(json.dumps(CONFIG))
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    return config


@pytest.fixture(scope="module")
def target():
    return qwen3_target()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("dflash") / "ckpt")


# ------------------------------------------------------------------------ the published computation


def rms(x, weight, eps=1e-6):
    return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rope(x, positions, theta=10000.0):
    """Rotary embedding, the first half of each head paired with the second. x: [heads, n, d]."""
    half = x.shape[-1] // 2
    angles = positions.double()[:, None] * theta ** (-torch.arange(half).double() * 2 / x.shape[-1])
    cos, sin = angles.cos().float(), angles.sin().float()
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)


def published_block_logits(target, w, tokens):
    """The block logits for one row (``tokens``: its real tokens, the last one the block's first),
    written from the published description. Returns ``[BLOCK - 1, V]``."""
    n = len(tokens)
    states = target(tokens[None, :-1], output_hidden_states=True).hidden_states
    context = rms(torch.cat([states[i + 1][0] for i in (0, 2)], -1) @ w["fc.weight"].T, w["hidden_norm.weight"])
    x = target.get_input_embeddings()(torch.tensor([int(tokens[-1])] + [MASK] * (BLOCK - 1)))
    q_pos, k_pos = torch.arange(n - 1, n - 1 + BLOCK), torch.arange(n - 1 + BLOCK)
    for i in range(LAYERS):
        p = f"layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(BLOCK, HEADS, HEAD_DIM).transpose(0, 1)
        q = rope(rms(q, w[p + "self_attn.q_norm.weight"]), q_pos)
        source = torch.cat([context, h])
        k = (source @ w[p + "self_attn.k_proj.weight"].T).view(-1, KV_HEADS, HEAD_DIM).transpose(0, 1)
        k = rope(rms(k, w[p + "self_attn.k_norm.weight"]), k_pos).repeat_interleave(HEADS // KV_HEADS, 0)
        v = (source @ w[p + "self_attn.v_proj.weight"].T).view(-1, KV_HEADS, HEAD_DIM).transpose(0, 1)
        v = v.repeat_interleave(HEADS // KV_HEADS, 0)
        out = torch.softmax(q @ k.transpose(1, 2) / HEAD_DIM ** 0.5, -1) @ v  # no mask: both directions
        x = x + out.transpose(0, 1).reshape(BLOCK, -1) @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        x = x + (F.silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[
            p + "mlp.down_proj.weight"].T
    return target.lm_head(rms(x, w["norm.weight"])[1:]).float()


class Checking(DFlashDrafter):
    """Before each proposal: the block logits equal the published computation's for every row."""

    checked = 0

    def propose(self, state, num_tokens):
        got = self._block_logits(state)
        with torch.no_grad():
            for r, tokens in enumerate(state.contexts()):
                torch.testing.assert_close(got[r], published_block_logits(self.target, WEIGHTS, tokens),
                                           rtol=0, atol=1e-4)
                type(self).checked += 1
        return super().propose(state, num_tokens)


# ------------------------------------------------------------------------ tests


def test_greedy_equals_target_greedy_eager_and_static(target, folder):
    assert is_dflash_checkpoint(folder) and not is_dflash_checkpoint(folder / "nowhere")
    drafter = load_dflash(folder, target)
    assert isinstance(drafter, DFlashDrafter) and not drafter.model.training
    assert drafter.model.config.target_layer_ids == (0, 2) and drafter.model.config.qk_norm
    one = left_padded([7], vocab=111, seed=2)[0]
    ids, mask = left_padded([5, 9, 2], vocab=111, seed=3)
    for path in ("eager", "static"):
        out = specdecode.generate(target, drafter, one, num_draft_tokens=3, max_new_tokens=16, decode_path=path)
        assert torch.equal(out.sequences, hf_greedy(target, one, max_new_tokens=16))
        out = specdecode.generate(target, drafter, ids, mask, num_draft_tokens=3, max_new_tokens=16, decode_path=path)
        assert torch.equal(out.sequences, hf_greedy(target, ids, mask, max_new_tokens=16))
        assert out.stats.drafter == "dflash" and out.stats.draft_calls > 0


def test_block_logits_equal_the_published_computation(target, folder):
    Checking.checked = 0
    drafter = Checking(target, load_dflash(folder, target).model)
    prompt = left_padded([6], vocab=111, seed=4)[0]
    out = specdecode.generate(target, drafter, prompt, num_draft_tokens=3, max_new_tokens=12)
    assert torch.equal(out.sequences, hf_greedy(target, prompt, max_new_tokens=12))
    assert Checking.checked >= 3


def test_sharded_weights_and_load_drafter(target, folder, tmp_path):
    sharded = load_dflash(write_checkpoint(tmp_path / "sharded", shards=3), target)
    whole = load_dflash(folder, target)
    assert all(torch.equal(v, whole.model.state_dict()[k]) for k, v in sharded.model.state_dict().items())
    assert isinstance(specdecode.load_drafter(folder, target), DFlashDrafter)


def test_config_variants_read(target, tmp_path):
    newer = variant(block_size=None, rope_theta=None, rope_parameters={"rope_theta": 5e5, "rope_type": "default"},
                    dflash_config={"mask_token_id": MASK, "target_layer_ids": [0, 2], "block_size": 6})
    config = read_dflash_config(write_checkpoint(tmp_path / "newer", newer), target)
    assert (config.block_size, config.rope_theta, config.target_layer_ids) == (6, 5e5, (0, 2))
    assert load_dflash(tmp_path / "newer", target, tree=[(0,), (1,)]).model.block_size == 6
    spread = variant(dflash_config={"mask_token_id": MASK}, model_type="llama")
    config = read_dflash_config(write_checkpoint(tmp_path / "spread", spread), target)
    assert config.target_layer_ids == default_target_layer_ids(4, LAYERS) and config.qk_norm  # q_norm weights


def test_bad_folders_and_targets_are_refused(target, tmp_path):
    def refused(name, match, config=None, weights=None, against=target):
        folder = write_checkpoint(tmp_path / name, config, weights)
        with pytest.raises(ValueError, match=match):
            load_dflash(folder, against)

    refused("arch", r"path: .*DFlash2DraftModel", variant(architectures=["DFlash2DraftModel"], selector_rank=8))
    refused("no_dflash", r"path: .*dflash_config", variant(dflash_config=None))
    refused("no_mask", r"path: .*mask_token_id", variant(dflash_config={"target_layer_ids": [0, 2]}))
    refused("no_hidden", r"path: .*hidden_size", variant(hidden_size=None))
    refused("hidden", r"target: hidden size 64", against=qwen3_target(hidden=64))
    refused("deep", r"target: 4 decoder layers.*num_target_layers", variant(num_target_layers=6))
    refused("layer", r"target: 4 decoder layers.*reads layer 7",
            variant(dflash_config={"mask_token_id": MASK, "target_layer_ids": [0, 7]}))
    refused("mask", r"target: .*mask token id 111",
            variant(dflash_config={"mask_token_id": 111, "target_layer_ids": [0, 2]}))
    refused("sliding", r"path: .*sliding draft layers are not supported",
            variant(layer_types=["full_attention", "sliding_attention"], sliding_window=8))
    refused("yarn", r"path: .*rope_scaling", variant(rope_parameters={"rope_theta": 1e4, "rope_type": "yarn"}))
    refused("weight", r"path: .*missing \['layers.1.mlp.up_proj.weight'\]",
            weights={k: v for k, v in WEIGHTS.items() if k != "layers.1.mlp.up_proj.weight"})
    refused("extra", r"path: .*unexpected \['embed_tokens.weight'\]",
            weights={**WEIGHTS, "embed_tokens.weight": torch.zeros(111, H)})
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"path: .*config.json"):
        load_dflash(tmp_path / "empty", target)
    with pytest.raises(ValueError, match="path: .*no trained drafter"):
        specdecode.load_drafter(write_checkpoint(tmp_path / "other", variant(architectures=["Qwen3ForCausalLM"])),
                                target)
