"""MTPDrafter: a model's own multi-token-prediction layers (transformers' ``MtpModel``) as a
drafter, on tiny GLM-4-MoE targets built offline with 1, 2 and 3 MTP layers (and DeepSeek-V3's
latent attention, whose cached keys and values differ in size). Greedy output is
the target's own and transformers' ``generate(..., use_mtp=True)``'s (batch 1 and a left-padded
batch of 3; the layers loaded from the target's checkpoint as transformers loads them); every
chain proposal's draft logits, and every node of a rank-path tree, equal transformers'
``MtpModel`` run from scratch over the row's own context and path (through rejections, re-packs
and finished rows); the static path drafts the eager path's chains and trees and reads nothing
on the host; sampled chains and trees are lossless at T = 1 (eager and static), a drafter that
reports a wrong ``q`` fails the same test, and bad arguments are refused by name."""

from __future__ import annotations

import pytest
import torch
from drafter_harness import checking, greedy_equals_target, repack_often, sampled_p
from test_generate_models import PAD, left_padded
from test_generate_sampling import FAIL_P, N, PASS_P, PROMPT, V, exact_joint
from test_static_features import guard_static_propose

import specdecode
from specdecode.drafters.mtp import MTPDrafter

try:  # transformers' MTP layers (the 5.2x releases; the supported floor has none)
    from transformers.modeling_layers import MtpModel  # noqa: F401
except ImportError:  # pragma: no cover - older transformers
    pytest.skip("this transformers has no MtpModel", allow_module_level=True)

HIDDEN = 2  # the tiny targets' decoder layers: MTP layer k sits at checkpoint layer HIDDEN + k
HF = dict(max_new_tokens=20, eos_token_id=[6], pad_token_id=PAD)  # the 7-token targets' greedy runs


def tiny_target(num_mtp_layers: int, vocab: int = 111, seed: int = 0, init: float = 0.02, mtp_std: float = 0.3,
                repeat: bool = False, arch: str = "glm4_moe"):
    """A GLM-4-MoE (or DeepSeek-V3: latent attention, whose cached keys and values differ in
    size) target, float32, seeded, and transformers' MtpModel for it, its layers drawn at random
    (``mtp_std``; norms near 1). ``repeat``: tied embeddings, and MTP layers that pass the
    token's embedding through (plus the noise), so each layer mostly drafts its input token
    again: often right on a target that repeats tokens, often wrong."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, Glm4MoeConfig, Glm4MoeForCausalLM
    from transformers.modeling_layers import MtpModel

    common = dict(vocab_size=vocab, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                  num_hidden_layers=HIDDEN, num_attention_heads=4, n_routed_experts=4, num_experts_per_tok=2,
                  n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1, num_mtp_layers=num_mtp_layers,
                  max_position_embeddings=256, initializer_range=init, pad_token_id=PAD, eos_token_id=None,
                  bos_token_id=None, tie_word_embeddings=repeat)
    if arch == "deepseek_v3":
        config = DeepseekV3Config(num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=4,
                                  qk_nope_head_dim=8, v_head_dim=8, **common)
    else:
        config = Glm4MoeConfig(num_key_value_heads=2, head_dim=8, **common)
    config.dtype = torch.float32  # what a loaded model's config says (MtpModel.from_pretrained reads it)
    torch.manual_seed(seed)
    target = (DeepseekV3ForCausalLM if arch == "deepseek_v3" else Glm4MoeForCausalLM)(config).eval()
    target.generation_config.eos_token_id = None
    mtp = MtpModel(target, num_mtp_layers)
    g = torch.Generator().manual_seed(seed + 5)
    with torch.no_grad():
        for name, p in mtp.named_parameters():
            if name.startswith(("embed_tokens", "shared_head")):
                continue  # the target's own
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            elif "e_score" in name:
                p.zero_()
            else:
                p.copy_(mtp_std * torch.randn(p.shape, generator=g))
        if repeat:
            for layer in mtp.layers:
                layer.eh_proj.weight[:, :32] += 3 * torch.eye(32)  # [enorm(embedding), hnorm(hidden)] in
    return target, mtp.eval()


def save_checkpoint(target, mtp, folder) -> None:
    """Write ``mtp``'s layers into a checkpoint of ``target`` in the layout transformers reads
    (MTP layer ``k`` as decoder layer ``num_hidden_layers + k``) and point the target at it. The
    real GLM-4-MoE checkpoints keep them at layer 46 or 92; the instance's ignore list names
    the tiny target's."""
    from safetensors.torch import save_file

    state = {}
    for key, value in mtp.state_dict().items():
        if key.startswith("layers."):
            _, k, rest = key.split(".", 2)
            state[f"model.layers.{HIDDEN + int(k)}.{rest.replace('mtp_block.', '')}"] = value.contiguous()
    save_file(state, str(folder / "model.safetensors"))
    target.config.save_pretrained(str(folder))
    target.config.name_or_path = str(folder)
    count = len(mtp.layers)
    target._keys_to_ignore_on_load_unexpected = [rf"model\.layers\.{HIDDEN + k}\..*" for k in range(count)]


@pytest.fixture(scope="module")
def checkpointed(tmp_path_factory):
    target, mtp = tiny_target(2, vocab=111, seed=1)
    save_checkpoint(target, mtp, tmp_path_factory.mktemp("mtp"))
    return target, mtp


def test_from_target_loads_the_layers_transformers_loads(checkpointed):
    target, mtp = checkpointed
    drafter = MTPDrafter.from_target(target)
    assert drafter.num_layers == 2 and drafter.default_num_draft_tokens == 2
    want = mtp.state_dict()
    got = drafter.mtp_model.state_dict()
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
    assert drafter.mtp_model.shared_head is target.get_output_embeddings()


def test_through_custom_generate(checkpointed):
    target, _ = checkpointed
    ids, mask = left_padded([4, 6], vocab=111, seed=5)
    hf = dict(attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=PAD)
    seq = target.generate(ids, custom_generate=specdecode.custom_generate, draft_model=MTPDrafter.from_target(target),
                          **hf)
    assert torch.equal(seq, target.generate(ids, **hf))


def test_greedy_equals_target_and_transformers_mtp(checkpointed):
    target, _ = checkpointed
    drafter = MTPDrafter.from_target(target)
    one = left_padded([7], vocab=111, seed=2)[0]
    hf = dict(max_new_tokens=16, pad_token_id=PAD)
    out = greedy_equals_target(target, drafter, one, hf=hf)
    assert out.stats.drafter == "mtp" and out.stats.draft_calls > 0
    assert torch.equal(target.generate(one, use_mtp=True, do_sample=False, **hf), out.sequences)
    ids, mask = left_padded([5, 9, 2], vocab=111, seed=3)
    out = greedy_equals_target(target, drafter, ids, mask, hf=hf)
    for r in range(3):  # transformers' MTP generation runs one row at a time
        row = ids[r, mask[r].bool()][None]
        mtp = target.generate(row, use_mtp=True, do_sample=False, **hf)
        assert torch.equal(out.sequences[r, ids.shape[1]:], mtp[0, row.shape[1]:])


def reference_logits(target, model, context: torch.Tensor, path: list[int]) -> torch.Tensor:
    """Transformers' MTP layers from scratch for one row: its real tokens ``context`` (the pending
    one last), the target's hidden states from a plain forward, a fresh ``MtpCache``; layer ``j``
    reads the drafts ``path[:j]`` (transformers rolls each draft into the next layer).
    Shape: returns ``[len(path) + 1, V]``: layer ``j``'s logits at the pending token."""
    from transformers.cache_utils import MtpCache

    n = len(context)
    states = target(context[None, :-1], output_hidden_states=True).hidden_states[-1]
    tokens, positions = context[None, 1:], torch.arange(1, n)[None]
    cache = MtpCache(config=model.config)
    logits = []
    for j in range(len(path) + 1):
        states = model.forward_layer(j, states, positions, cache, input_ids=tokens)
        logits.append(model._project_to_logits(states[:, -1]).float())
        if j < len(path):
            tokens = torch.cat([tokens[:, 1:], torch.tensor([[path[j]]])], 1)
            positions = positions + 1
    return torch.cat(logits)


def check_row(drafter, proposal, r, context) -> bool:
    """Row ``r`` (at least two real tokens: ``context``) against transformers' ``MtpModel`` from
    scratch (:func:`reference_logits`): its logits are the ``q`` returned (chains), or each tree
    node is the top rank its path names of the reference logits after the node's path."""
    if len(context) < 2:
        return False
    tokens = proposal.draft_tokens[r].tolist()
    if proposal.tree is None:
        want = reference_logits(drafter.target, drafter.mtp_model, context, tokens[:-1])
        torch.testing.assert_close(proposal.draft_logits[r], want, rtol=1e-4, atol=1e-4)
        return True
    parents = proposal.tree.parents[r].tolist()
    for node, path_ranks in enumerate(drafter.choices, start=1):
        path, up = [], parents[node]
        while up > 0:
            path.insert(0, tokens[up])
            up = parents[up]
        logits = reference_logits(drafter.target, drafter.mtp_model, context, path)[-1]
        assert tokens[node] == int(logits.topk(path_ranks[-1] + 1).indices[-1]), (node, path_ranks)
    return True


Checking = checking(MTPDrafter, check_row)


@pytest.mark.parametrize("num_mtp_layers, num_draft_tokens, tree, arch", [
    (1, 1, None, "glm4_moe"), (2, 2, None, "glm4_moe"), (3, 3, None, "glm4_moe"), (3, 2, None, "glm4_moe"),
    (2, 4, None, "glm4_moe"), (1, 1, [(0,), (1,), (2,)], "glm4_moe"),
    (3, 3, [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 0)], "glm4_moe"),
    (2, 2, None, "deepseek_v3"), (2, 2, [(0,), (1,), (0, 0), (1, 0)], "deepseek_v3")])
def test_drafts_equal_transformers_mtp_model_from_scratch(num_mtp_layers, num_draft_tokens, tree, arch, monkeypatch):
    repack_often(monkeypatch)
    seed = 4 if arch == "glm4_moe" else 0  # (seeds whose rows accept different lengths: re-packs)
    target, mtp = tiny_target(num_mtp_layers, vocab=7, seed=seed, init=0.3, mtp_std=0.15, repeat=True, arch=arch)
    drafter = Checking(target, mtp, tree=tree)
    ids, mask = left_padded([5, 9, 1], vocab=7, seed=4)
    out = greedy_equals_target(target, drafter, ids, mask, hf=HF, num_draft_tokens=num_draft_tokens)
    assert drafter.checked > 10 and out.stats.accepted_tokens > 3
    drafted, accepted = out.stats.position_drafted, out.stats.position_accepted
    if tree is None:
        assert len(drafted) == min(num_draft_tokens, num_mtp_layers) and accepted[-1] > 0  # the last layer's too
        assert out.stats.repacks > 0
    else:
        assert out.stats.tree_rule == "deterministic" and len(accepted) == len(tree[-1]) and accepted[-1] > 0


@pytest.mark.parametrize("num_mtp_layers, num_draft_tokens, arch", [(1, 1, "glm4_moe"), (3, 3, "glm4_moe"),
                                                                   (3, 2, "glm4_moe"), (2, 2, "deepseek_v3")])
def test_static_path_greedy_with_the_eager_drafts(num_mtp_layers, num_draft_tokens, arch):
    """Greedy output is the target's on the static path, batch 1 and a left-padded batch with
    EOS, and the drafts are the eager path's (the same acceptance, step for step)."""
    target, mtp = tiny_target(num_mtp_layers, vocab=7, seed=4, init=0.3, mtp_std=0.15, repeat=True, arch=arch)
    drafter = MTPDrafter(target, mtp)
    for lengths in ([7], [5, 9, 1]):
        ids, mask = left_padded(lengths, vocab=7, seed=4)
        eager = greedy_equals_target(target, drafter, ids, mask, hf=HF, num_draft_tokens=num_draft_tokens)
        static = greedy_equals_target(target, drafter, ids, mask, hf=HF, num_draft_tokens=num_draft_tokens,
                                      decode_path="static")
        assert static.stats.decode_path == "static"
        assert static.stats.position_accepted == eager.stats.position_accepted
        assert static.stats.accepted_tokens > 3


class Recording(MTPDrafter):
    """Keeps every tree it drafts, on either path (eager proposals and static drafts)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.trees = []

    def propose(self, state, num_tokens):
        proposal = super().propose(state, num_tokens)
        self.trees.append(proposal.draft_tokens.clone())
        return proposal

    def static_propose_tree(self, state, plan):
        draft = super().static_propose_tree(state, plan)
        self.trees.append(draft.tokens.clone())
        return draft


@pytest.mark.parametrize("num_mtp_layers, tree, arch", [
    (1, [(0,), (1,), (2,)], "glm4_moe"), (3, [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)], "glm4_moe"),
    (2, [(0,), (1,), (0, 0), (1, 0)], "deepseek_v3")])
def test_static_trees_are_the_eager_trees(num_mtp_layers, tree, arch):
    target, mtp = tiny_target(num_mtp_layers, vocab=7, seed=4, init=0.3, mtp_std=0.15, repeat=True, arch=arch)
    one = left_padded([7], vocab=7, seed=4)[0]
    eager, static = Recording(target, mtp, tree=tree), Recording(target, mtp, tree=tree)
    greedy_equals_target(target, eager, one, hf=HF)
    out = greedy_equals_target(target, static, one, hf=HF, decode_path="static")
    assert out.stats.tree_rule == "deterministic"
    assert len(eager.trees) == len(static.trees) > 3
    assert all(torch.equal(a, b) for a, b in zip(eager.trees, static.trees))
    ids, mask = left_padded([5, 9, 1], vocab=7, seed=4)
    out = greedy_equals_target(target, static, ids, mask, hf=HF, decode_path="static")
    assert out.stats.position_accepted[-1] > 0


def test_static_tree_reads_nothing_on_the_host():
    target, mtp = tiny_target(2, vocab=111, seed=4)
    drafter = MTPDrafter(target, mtp, tree=[(0,), (1,), (0, 0), (1, 0)])
    calls = guard_static_propose(drafter, "static_propose_tree")
    ids, mask = left_padded([5, 3], vocab=111, seed=8)
    out = specdecode.generate(target, drafter, ids, mask, max_new_tokens=10, do_sample=True, decode_path="static",
                              pad_token_id=PAD, generator=torch.Generator().manual_seed(0))
    assert calls[0] == out.stats.decode_steps_run > 0


def test_static_propose_reads_nothing_on_the_host():
    target, mtp = tiny_target(2, vocab=111, seed=4)
    drafter = MTPDrafter(target, mtp)
    calls = guard_static_propose(drafter)
    ids, mask = left_padded([5, 3], vocab=111, seed=8)
    out = specdecode.generate(target, drafter, ids, mask, num_draft_tokens=2, max_new_tokens=10, do_sample=True,
                              decode_path="static", pad_token_id=PAD, generator=torch.Generator().manual_seed(0))
    assert calls[0] == out.stats.decode_steps_run > 0


# ------------------------------------------------------------------------ sampling exactness


@pytest.fixture(scope="module")
def sampling_target():
    """A peaked, context-dependent 8-token target with 2 MTP layers."""
    return tiny_target(2, vocab=V, seed=6, init=0.3, mtp_std=0.15, repeat=True)


@pytest.fixture(scope="module")
def joint(sampling_target):
    return exact_joint(sampling_target[0], PROMPT)


@pytest.mark.parametrize("path", ["eager", "static"])
def test_sampled_chain_is_lossless(sampling_target, joint, path):
    target, mtp = sampling_target
    out, p = sampled_p(target, MTPDrafter(target, mtp), joint, decode_path=path)
    assert 0.05 < out.stats.acceptance_rate < 0.95 and p > PASS_P


@pytest.mark.parametrize("path", ["eager", "static"])
def test_sampled_tree_is_lossless(sampling_target, joint, path):
    target, mtp = sampling_target
    # half the samples: the deterministic rule reads no q (the chain tests check the q path at full size)
    drafter = MTPDrafter(target, mtp, tree=[(0,), (1,), (0, 0), (1, 0)])
    out, p = sampled_p(target, drafter, joint, n=N // 2, decode_path=path)
    assert out.stats.tree_rule == "deterministic" and out.stats.accepted_tokens > 500 and p > PASS_P


class WrongQ(MTPDrafter):
    """Broken: the drafts are drawn from the MTP layers' logits, but ``q`` is reported one token
    id off (the logits rolled over the vocabulary)."""

    def propose(self, state, num_tokens):
        proposal = super().propose(state, num_tokens)
        proposal.draft_logits = proposal.draft_logits.roll(1, -1)
        return proposal


def test_a_wrong_q_fails_the_same_test(sampling_target, joint):
    target, mtp = sampling_target
    _, p = sampled_p(target, WrongQ(target, mtp), joint, n=N // 4)  # fails by far with fewer samples
    assert p < FAIL_P


# ------------------------------------------------------------------------ refusals


def test_refusals_name_the_argument():
    from test_generate_models import make_model

    plain = make_model("llama", vocab=111, layers=2)
    target, mtp = tiny_target(2, vocab=111)
    with pytest.raises(ValueError, match="target: .*num_mtp_layers"):
        MTPDrafter(plain, mtp)
    with pytest.raises(ValueError, match="target: .*num_mtp_layers"):
        MTPDrafter.from_target(plain)
    with pytest.raises(TypeError, match="mtp_model"):
        MTPDrafter(target, plain)
    other, other_mtp = tiny_target(2, vocab=7)
    with pytest.raises(ValueError, match="mtp_model: built for another model"):
        MTPDrafter(target, other_mtp)
    ids = left_padded([4], vocab=111)[0]
    with pytest.raises(ValueError, match="num_draft_tokens: MTPDrafter has 2 MTP layers"):
        specdecode.generate(target, MTPDrafter(target, mtp), ids, num_draft_tokens=3, max_new_tokens=4,
                            decode_path="static")
    with pytest.raises(ValueError, match="tree: path .* deeper"):
        MTPDrafter(target, mtp, tree=[(0,), (0, 0), (0, 0, 0)])
    with pytest.raises(ValueError, match="tree: None asks for a chain"):
        specdecode.generate(target, MTPDrafter(target, mtp, tree=[(0,), (1,)]), ids, max_new_tokens=4, tree=None)
    with pytest.raises(ValueError, match="tree: a path asks for the rank-7 token"):
        specdecode.generate(other, MTPDrafter(other, other_mtp, tree=[(7,)]), ids % 7, max_new_tokens=4)
    target.config.dtype = None
    with pytest.raises(ValueError, match="target: its config has no dtype"):
        MTPDrafter.from_target(target)


def test_nothing_the_user_passed_is_modified():
    target, mtp = tiny_target(2, vocab=7, seed=2, init=0.3)
    before = {k: v.clone() for k, v in {**target.state_dict(), **mtp.state_dict()}.items()}
    ids, mask = left_padded([4, 6], vocab=7, seed=1)
    kept_ids, kept_mask = ids.clone(), mask.clone()
    specdecode.generate(target, MTPDrafter(target, mtp), ids, mask, max_new_tokens=8, pad_token_id=PAD)
    after = {**target.state_dict(), **mtp.state_dict()}
    assert all(torch.equal(after[k], v) for k, v in before.items())
    assert torch.equal(ids, kept_ids) and torch.equal(mask, kept_mask)
