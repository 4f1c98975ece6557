"""Recurrent and hybrid models on the static path (specdecode.models.recurrent_static): the
verification forward steps every recurrent mixer one position at a time, records its states
after each, and the commit gives each row the states after the drafts it kept. Greedy output
equals the model's own generate for seven hybrid families, alone and in ragged batches, with
every row keeping its own number of drafts; the exact sampling test passes and fails when the
states are not chosen; what cannot run is refused naming the argument."""

from __future__ import annotations

import pytest
import torch
from test_generate_models import PAD, left_padded
from test_generate_recurrent import FAIL_P, HYBRIDS, PASS_P, PROMPT, V, hybrid_model
from test_generate_sampling import K, chi_square_p, exact_joint
from test_generate_windows import alone, llama_draft

from specdecode import generate
from specdecode.drafters import DrafterBase, DraftState, NgramDrafter, Proposal
from specdecode.engine import static_loop
from specdecode.models.static_cache import ColumnCache
from specdecode.trees.builders import DynamicTree


@pytest.fixture(autouse=True)
def _fresh_sessions():
    static_loop.clear_static_sessions()
    yield
    static_loop.clear_static_sessions()


class OracleDrafter(DrafterBase):
    """Proposes each row's known greedy continuation, one position spoiled by a schedule that
    walks through every position (so rows keep 0 .. k drafts, differently in a batch): a host
    drafter, so it runs on the static path as prompt lookup does."""

    name = "oracle"
    static_host_drafts = True

    def __init__(self, prompts: list[torch.Tensor], continuations: torch.Tensor, vocab: int) -> None:
        self.prompts = [p.tolist() for p in prompts]
        self.continuations, self.vocab = continuations, vocab

    def propose(self, state: DraftState, num_tokens: int) -> Proposal:
        rows = []
        for context in state.contexts():
            row = next(i for i, p in enumerate(self.prompts) if context[: len(p)].tolist() == p)
            done = context.numel() - len(self.prompts[row])
            tokens = self.continuations[row, done: done + num_tokens].clone()
            tokens = torch.cat([tokens, tokens.new_full((num_tokens - tokens.numel(),), 3)])
            spoil = (done + row) % (num_tokens + 2)  # past the end: nothing spoiled
            if spoil < num_tokens:
                tokens[spoil] = (tokens[spoil] + 1) % self.vocab
            rows.append(tokens)
        return Proposal(torch.stack(rows).to(state.device))


class OracleTreeDrafter(OracleDrafter):
    """Tries of two branches under the root: first a wrong one (its first token spoiled), then the
    known continuation with one token spoiled as :class:`OracleDrafter` spoils it, so every step
    steps the wrong branch before the right one (whose first node must start again from the root's
    states) and keeps 0 .. ``depth`` of the right one's nodes."""

    def __init__(self, prompts: list[torch.Tensor], continuations: torch.Tensor, vocab: int, depth: int) -> None:
        super().__init__(prompts, continuations, vocab)
        self.tree_depth, self.num_nodes = depth, 2 * depth + 1

    def propose(self, state: DraftState, num_tokens: int) -> Proposal:
        from specdecode.trees import TokenTree

        d = self.tree_depth
        right = super().propose(state, d).draft_tokens  # [B, d]
        wrong = right.clone()
        wrong[:, 0] = (wrong[:, 0] + 2) % self.vocab
        rows = right.shape[0]
        root = torch.stack([c[-1] for c in state.contexts()]).to(right.device)
        tokens = torch.cat([root[:, None], wrong, right], 1)
        chain = list(range(-1, d))  # the wrong branch: nodes 1 .. d, each the child of the one before
        parents = torch.tensor([chain + [0] + list(range(d + 1, 2 * d))] * rows, device=right.device)
        tree = TokenTree(tokens, parents, torch.full((rows,), 2 * d + 1, device=right.device))
        return Proposal(tokens, None, tree=tree, children="deterministic")


def _real_prompts(ids: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    return [ids[b, mask[b].bool()] for b in range(ids.shape[0])]


@pytest.mark.parametrize("kind", HYBRIDS)
def test_greedy_equals_the_model_alone(kind):
    target = hybrid_model(kind)
    ids = torch.randint(3, V, (1, 14), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    want = alone(target, ids, mask, 18)
    oracle = OracleDrafter(_real_prompts(ids, mask), want, V)
    out = generate(target, oracle, ids, max_new_tokens=18, num_draft_tokens=3, decode_path="static",
                   eos_token_id=[], pad_token_id=PAD)
    assert torch.equal(out.sequences[:, 14:], want)
    kept = {a for step in out.stats.accepted_lengths for a in step}
    assert {0, 3} <= kept and kept & {1, 2}, kept  # steps kept none, some and all of their drafts
    if kind in ("lfm2", "falcon_h1"):  # a draft model (rejections nearly everywhere)
        out = generate(target, llama_draft(), ids, max_new_tokens=12, num_draft_tokens=2, decode_path="static",
                       eos_token_id=[], pad_token_id=PAD)
        assert torch.equal(out.sequences[:, 14:], want[:, :12])


@pytest.mark.parametrize("kind", ["qwen3_next", "bamba"])
def test_ragged_batches_keep_each_rows_own_drafts(kind):
    target = hybrid_model(kind)
    ids, mask = left_padded([13, 8, 11], vocab=V, seed=2)
    want = alone(target, ids, mask, 16)
    oracle = OracleDrafter(_real_prompts(ids, mask), want, V)
    out = generate(target, oracle, ids, mask, max_new_tokens=16, num_draft_tokens=3, decode_path="static",
                   eos_token_id=[], pad_token_id=PAD)
    assert torch.equal(out.sequences[:, ids.shape[1]:], want)
    # the same layout again (its states are emptied by the prefill), rows that finish early
    eos = int(want[1, 4])
    out = generate(target, oracle, ids, mask, max_new_tokens=16, num_draft_tokens=3, decode_path="static",
                   eos_token_id=eos, pad_token_id=PAD)
    for row in range(3):
        got, ref = out.sequences[row, ids.shape[1]:].tolist(), want[row].tolist()
        stop = ref.index(eos) + 1 if eos in ref else len(ref)
        assert got[:stop] == ref[:stop]


@pytest.mark.parametrize("kind", ["lfm2", "qwen3_next", "bamba"])
def test_trees_step_each_node_from_its_parent(kind):
    """Token trees: each node's mixers step from its parent's recorded states, and each row keeps
    the states after its accepted path's last node (a host drafter's tries, a ragged batch; a draft
    model's dynamic trees on one family)."""
    target = hybrid_model(kind)
    ids, mask = left_padded([13, 8, 11], vocab=V, seed=4)
    want = alone(target, ids, mask, 16)
    oracle = OracleTreeDrafter(_real_prompts(ids, mask), want, V, depth=3)
    out = generate(target, oracle, ids, mask, max_new_tokens=16, decode_path="static", eos_token_id=[],
                   pad_token_id=PAD)
    assert torch.equal(out.sequences[:, ids.shape[1]:], want)
    kept = {a for step in out.stats.accepted_lengths for a in step}
    assert {0, 3} <= kept and kept & {1, 2}, kept
    if kind == "lfm2":
        out = generate(target, llama_draft(), ids, mask, max_new_tokens=10, decode_path="static",
                       tree=DynamicTree(6, 3, top_k=2, calibrated=False), eos_token_id=[], pad_token_id=PAD)
        assert torch.equal(out.sequences[:, ids.shape[1]:], want[:, :10])


def test_a_hybrid_with_sliding_window_layers():
    """LFM3: short convolutions, a full-attention and a sliding-window layer (its static cache a
    ring): the prefill's masks are the ring's and the recurrent layers' padding together."""
    tf = pytest.importorskip("transformers")
    if not hasattr(tf, "Lfm3Config"):
        pytest.skip("this transformers has no LFM3")
    torch.manual_seed(0)
    config = tf.Lfm3Config(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                           num_attention_heads=4, num_key_value_heads=2, sliding_window=6,
                           layer_types=["conv", "sliding_attention", "full_attention", "conv"],
                           max_position_embeddings=256, pad_token_id=PAD, eos_token_id=1, bos_token_id=2)
    target = _random(config)
    ids, mask = left_padded([13, 8, 11], vocab=V, seed=2)
    want = alone(target, ids, mask, 16)  # past the window
    out = generate(target, OracleDrafter(_real_prompts(ids, mask), want, V), ids, mask, max_new_tokens=16,
                   num_draft_tokens=3, decode_path="static", eos_token_id=[], pad_token_id=PAD)
    assert torch.equal(out.sequences[:, ids.shape[1]:], want)


def test_the_target_alone_and_prompt_lookup():
    target = hybrid_model("nemotron_h")
    ids, mask = left_padded([12, 7], vocab=V, seed=5)
    want = alone(target, ids, mask, 12)
    for draft in (None, NgramDrafter()):
        out = generate(target, draft, ids, mask, max_new_tokens=12, decode_path="static", eos_token_id=[],
                       pad_token_id=PAD)
        assert torch.equal(out.sequences[:, ids.shape[1]:], want)


def test_the_users_model_is_left_as_it_was():
    target = hybrid_model("lfm2")
    ids = torch.randint(3, V, (1, 10), generator=torch.Generator().manual_seed(3))
    forwards = {name: m.forward for name, m in target.named_modules()}
    generate(target, llama_draft(), ids, max_new_tokens=8, num_draft_tokens=3, decode_path="static",
             eos_token_id=[], pad_token_id=PAD)
    assert all("forward" not in m.__dict__ for m in target.modules())  # no mixer left stepping
    assert {name: m.forward for name, m in target.named_modules()} == forwards


# ---------------------------------------------------------------------------- sampling exactness

@pytest.fixture(scope="module")
def recurrent_pair():
    """LFM2 (short convolutions + attention) and a draft of the same 8-token vocabulary."""
    return hybrid_model("lfm2", vocab=8, seed=4, scale=0.3), llama_draft(vocab=8, seed=5)


def _sample(target, draft, n=20000):
    ids = torch.tensor([PROMPT]).expand(n, -1)
    out = generate(target, draft, ids, num_draft_tokens=2, do_sample=True, max_new_tokens=K, decode_path="static",
                   eos_token_id=[], pad_token_id=PAD, generator=torch.Generator().manual_seed(0))
    return out.sequences[:, len(PROMPT):]


def test_sampling_is_exact(recurrent_pair):
    target, draft = recurrent_pair
    assert chi_square_p(_sample(target, draft), exact_joint(target, PROMPT)) > PASS_P


def test_sampling_without_choosing_the_states_fails(recurrent_pair, monkeypatch):
    """Broken: every row keeps the states after all the fed columns, rejected drafts included."""
    target, draft = recurrent_pair
    monkeypatch.setattr(ColumnCache, "keep_states", lambda self, accepted: None)
    assert chi_square_p(_sample(target, draft), exact_joint(target, PROMPT)) < FAIL_P


def _sample_tree(target, draft, n=10000):
    ids = torch.tensor([PROMPT]).expand(n, -1)
    out = generate(target, draft, ids, do_sample=True, max_new_tokens=K, decode_path="static", eos_token_id=[],
                   pad_token_id=PAD, generator=torch.Generator().manual_seed(0),
                   tree=[[0], [1], [2], [0, 0]], tree_children="without_replacement", rule="rrs")
    return out.sequences[:, len(PROMPT):]


def test_tree_sampling_is_exact(recurrent_pair):
    """Three children drawn without replacement and a grandchild (recursive rejection sampling):
    the accepted child is often not the first node stepped after the root."""
    target, draft = recurrent_pair
    assert chi_square_p(_sample_tree(target, draft), exact_joint(target, PROMPT)) > PASS_P


def test_tree_sampling_stepping_nodes_in_a_row_fails(recurrent_pair, monkeypatch):
    """Broken: each node steps from the node before it rather than from its parent (siblings leak)."""
    import specdecode.models.recurrent_static as recurrent_static

    monkeypatch.setattr(recurrent_static.RecurrentLayers, "load_parent", lambda self, index, parents: None)
    target, draft = recurrent_pair
    assert chi_square_p(_sample_tree(target, draft), exact_joint(target, PROMPT)) < FAIL_P


# ---------------------------------------------------------------------------- refusals

def test_what_cannot_run_is_refused_naming_it():
    target = hybrid_model("qwen3_next")
    ids = torch.randint(3, V, (1, 8), generator=torch.Generator().manual_seed(6))
    with pytest.raises(ValueError, match=r"tree: .*qwen3_next.*recurrent"):  # the eager path: no trees
        generate(target, llama_draft(), ids, max_new_tokens=8, tree=DynamicTree(6, 3, top_k=2, calibrated=False),
                 eos_token_id=[], pad_token_id=PAD)
    with pytest.raises(ValueError, match=r"model: .*\(qwen3_next\) has recurrent layers; a draft model"):
        generate(llama_draft(), target, ids, max_new_tokens=8, decode_path="static", eos_token_id=[],
                 pad_token_id=PAD)


def _mamba(kind: str):
    import transformers as tf

    torch.manual_seed(0)
    config = (tf.MambaConfig if kind == "mamba" else tf.FalconMambaConfig)(
        vocab_size=V, hidden_size=64, num_hidden_layers=2, state_size=8, expand=2, conv_kernel=4, pad_token_id=PAD,
        eos_token_id=1, bos_token_id=2)
    return _random(config)


def _random(config):
    """The tiny model of ``config``, random weights as test_generate_recurrent.hybrid_model's."""
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.15)
    model.config.eos_token_id = model.generation_config.eos_token_id = None
    return model


@pytest.mark.parametrize("kind", ["jamba", "mamba", "falcon_mamba"])
def test_mixers_that_restart_on_several_tokens_run_stepped(kind):
    """Jamba's, Mamba's and FalconMamba's mixers take a forward of several tokens from a cache for
    a prompt (the eager path refuses them, naming the static path); stepped one token at a time
    they continue it. Mamba and FalconMamba have no attention layer: their forward takes the 2D
    padding mask of a prefill, and no mask in a step."""
    from specdecode.models.facts import RESTARTS_STATE, forward_problem
    from specdecode.models.recurrent_static import stepped_forward_problem

    target = hybrid_model("jamba") if kind == "jamba" else _mamba(kind)
    assert forward_problem(target) == RESTARTS_STATE and stepped_forward_problem(target) is None
    ids, mask = left_padded([12, 8], vocab=V, seed=9)
    want = alone(target, ids, mask, 12)
    oracle = OracleDrafter(_real_prompts(ids, mask), want, V)
    out = generate(target, oracle, ids, mask, max_new_tokens=12, num_draft_tokens=3, decode_path="static",
                   eos_token_id=[], pad_token_id=PAD)
    assert torch.equal(out.sequences[:, ids.shape[1]:], want)


# ---------------------------------------------------------------------------- compiled, feature drafters

def test_compiled_steps_trace_the_stepping_mixers_once(monkeypatch):
    """The compiled path (traced whole by Dynamo, run by AOT autograd's eager backend as in
    tests/test_static_compiled.py): the target's greedy output, and a second generation of the
    layout compiles nothing (the mixers' stepping forward is one function in every generation)."""
    import specdecode.engine.compiled as compiled
    from torch._dynamo.utils import counters

    monkeypatch.setattr(compiled, "BACKEND", "aot_eager")
    target = hybrid_model("lfm2")
    ids, mask = left_padded([9, 6], vocab=V, seed=7)
    want = alone(target, ids, mask, 10)
    oracle = OracleDrafter(_real_prompts(ids, mask), want, V)
    runs = []
    for _ in range(2):
        out = generate(target, oracle, ids, mask, max_new_tokens=10, num_draft_tokens=3, decode_path="compiled",
                       eos_token_id=[], pad_token_id=PAD)
        assert torch.equal(out.sequences[:, ids.shape[1]:], want)
        runs.append(counters["stats"]["unique_graphs"])
    assert runs[0] == runs[1]


def test_an_eagle_drafter_on_a_hybrid_target():
    from test_static_features import eagle_drafter

    target = hybrid_model("qwen3_next")
    ids, mask = left_padded([10, 7], vocab=V, seed=8)
    want = alone(target, ids, mask, 10)
    for path in ("eager", "static"):
        out = generate(target, eagle_drafter(target), ids, mask, max_new_tokens=10, num_draft_tokens=3,
                       decode_path=path, eos_token_id=[], pad_token_id=PAD)
        assert torch.equal(out.sequences[:, ids.shape[1]:], want), path


@pytest.mark.parametrize("kind", ["lfm2", "qwen3_next"])
def test_the_data_stage_continues_a_hybrid_target_on_the_static_path(kind):
    """A drafter's training data for a hybrid target: its continuations come from the static path
    now (before, the stage fell back to Hugging Face's generate), labelled by the decode steps as
    the labelling forward labels them."""
    from test_training_data_path import _prompts
    from test_training_decode_labels import _compare

    from specdecode.training.continuations import data_decode_path
    from specdecode.training.data import DataSettings

    target = hybrid_model(kind)
    settings = DataSettings(max_new_tokens=9, temperature=0.7, batch_size=3, top_k=16, feature_layers=(-1,))
    assert data_decode_path(target, settings) == "static"
    assert _compare(target, _prompts([4, 9, 6], V, seed=3), settings) is None
