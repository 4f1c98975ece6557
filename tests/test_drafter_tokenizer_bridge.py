"""TokenizerBridgeDrafter: a draft model with another tokenizer drafts through text.

- The text helpers map text across token boundaries exactly where a tokenizer can (every split
  of a canonical encoding), refuse where the text would merge into the last committed token,
  and keep the spaces a SentencePiece-style decoder strips at the start of a text.
- The draft's batched KV cache (rows of different lengths, roll-backs as holes, re-packs, rows
  leaving) gives the logits of a fresh forward over each row's tokens.
- Through a *permuted* tokenizer (same segmentation, other ids) and the correspondingly
  permuted draft, the bridge drafts exactly what the draft model would with the target's
  tokenizer: acceptance equals ModelDrafter's. Greedy output equals the target's own greedy
  generate on three architectures, batch 1 and a left-padded batch, also with genuinely
  different segmentations (byte-level BPE target, SentencePiece-style BPE draft).
- Sampling is exactly the target's distribution (token and block rules); the same proposals
  verified as if drawn from a uniform q fail the same test.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from test_generate_models import PAD, _one_thread, left_padded, make_model, make_pair  # noqa: F401
from test_generate_sampling import K, PROMPT, V, chi_square_p, exact_joint
from test_generate_sampling import pair as sampling_pair  # noqa: F401

import specdecode
from specdecode import TokenizerBridgeDrafter
from specdecode.drafters.tokenizer_bridge import (
    REPACK_MIN_WASTE,
    TextCodec,
    _DraftCache,
    texts_after,
    tokens_after,
)

PASS_P, FAIL_P = 1e-4, 1e-6


# ------------------------------------------------------------------ tokenizers built in the test


def corpus() -> list[str]:
    from specdecode.demo import demo_prompts

    return demo_prompts(40)


def train_bpe(kind: str, vocab_size: int):
    """A BPE tokenizer trained here on held-out Python snippets: ``"bytelevel"`` (GPT-2 style)
    or ``"metaspace"`` (SentencePiece style: spaces become '▁', stripped at the start)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "</s>", "<s>", "<unk>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    if kind == "bytelevel":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
        alphabet = ["é"]  # a non-ASCII character of the test texts
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, initial_alphabet=alphabet,
                                  show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", bos_token="<s>",
                                   unk_token="<unk>")


def permuted_tokenizer(tokenizer, perm: torch.Tensor):
    """The same tokenizer with every id ``i`` renamed ``perm[i]`` (a different tokenizer that
    segments text identically)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    spec["model"]["vocab"] = {w: int(perm[i]) for w, i in spec["model"]["vocab"].items()}
    for added in spec["added_tokens"]:
        added["id"] = int(perm[added["id"]])
    specials = {name: getattr(tokenizer, name) for name in ("pad_token", "eos_token", "bos_token", "unk_token")
                if getattr(tokenizer, name) is not None}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)), **specials)


def permuted_model(model, perm: torch.Tensor):
    """A copy of ``model`` reading and writing token ``perm[i]`` where ``model`` has ``i``."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        out.get_input_embeddings().weight[perm] = model.get_input_embeddings().weight
        head, emb = out.get_output_embeddings(), out.get_input_embeddings()
        if head is not None and head.weight is not emb.weight:
            head.weight[perm] = model.get_output_embeddings().weight
            if getattr(head, "bias", None) is not None:
                head.bias[perm] = model.get_output_embeddings().bias
    return out


def permutation(size: int, fixed: int, seed: int = 0) -> torch.Tensor:
    """A random permutation of ``range(size)`` that keeps ``range(fixed)`` in place."""
    g = torch.Generator().manual_seed(seed)
    return torch.cat([torch.arange(fixed), fixed + torch.randperm(size - fixed, generator=g)])


def word_tokenizer(words: list[str]):
    """A whitespace word tokenizer, one id per word, without special tokens (so decoding drops
    nothing that the target generates)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token=words[0]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


WORDS = [f"w{i}" for i in range(128)]  # the tiny models' vocabulary


def hf_greedy(target, ids, mask, max_new_tokens, **kwargs):
    return target.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                           pad_token_id=PAD, **kwargs)


# ------------------------------------------------------------------ text across token boundaries


@pytest.fixture(scope="module")
def tokenizers():
    return {"bytelevel": train_bpe("bytelevel", 400), "metaspace": train_bpe("metaspace", 300)}


TEXTS = ["def parse(self, text):\n    return  self._parse(text.strip())  # é ok\n",
         "for key, value in items.items():\n        out[key] = value\n"]


@pytest.mark.parametrize("kind", ["bytelevel", "metaspace"])
def test_tokens_after_inverts_every_split_of_a_canonical_encoding(tokenizers, kind):
    tok = tokenizers[kind]
    for text in TEXTS:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids, clean_up_tokenization_spaces=False) == text
        # every split but those inside a character's bytes (no text lies between the halves)
        splits = [j for j in range(1, len(ids)) if not tok.decode(ids[:j]).endswith("\ufffd")]
        rests = texts_after(tok, [ids[:j] for j in splits], [ids[j:] for j in splits])
        for j, rest in zip(splits, rests):
            assert tok.decode(ids[:j], clean_up_tokenization_spaces=False) + rest == text
        assert tokens_after(tok, [ids[:j] for j in splits], rests) == [ids[j:] for j in splits]


def test_tokens_after_refuses_a_merge_and_realigns_a_non_canonical_context(tokenizers):
    tok = tokenizers["bytelevel"]
    word = tok("    return", add_special_tokens=False)["input_ids"]
    assert len(word) == 2  # "    " and "return" (a merged token of the corpus)
    head = tok("    ret", add_special_tokens=False)["input_ids"]
    # text that would merge into the context's last token ("ret" + "urn" -> "return")
    assert tokens_after(tok, [head], ["urn x"]) == [None]
    # a context tokenized non-canonically ("retur" + "n") still maps text after its end
    pieces = tok("    retur", add_special_tokens=False)["input_ids"] + tok("n", add_special_tokens=False)["input_ids"]
    assert tok.decode(pieces) == "    return"
    after = tokens_after(tok, [pieces], [" self"])[0]
    assert tok.decode(after) == " self"


def test_text_after_keeps_the_space_a_sentencepiece_decoder_strips(tokenizers):
    tok = tokenizers["metaspace"]
    context = tok("value = compute", add_special_tokens=False)["input_ids"]
    new = tok("value = compute(x) + other", add_special_tokens=False)["input_ids"][len(context):]
    assert texts_after(tok, [context], [new]) == ["(x) + other"]
    space_first = tok("a b", add_special_tokens=False)["input_ids"]
    assert texts_after(tok, [space_first[:1]], [space_first[1:]]) == [" b"]
    assert tok.decode(space_first[1:]) == "b"  # decoded alone, the space is lost


# ------------------------------------------------------------------ the draft model's cache


def test_codec_agrees_with_the_tokenizer(tokenizers):
    tok = tokenizers["bytelevel"]
    codec = TextCodec(tok)
    assert codec.backend is not None
    want = tok(TEXTS, add_special_tokens=False)["input_ids"]
    assert codec.encode(TEXTS) == want
    assert codec.decode(want) == tok.batch_decode(want, clean_up_tokenization_spaces=False)
    tok.pad_token = "<pad>"
    tok(TEXTS, padding=True)  # a user's padded call leaves padding set on the backend ...
    assert tok.backend_tokenizer.padding is not None
    assert codec.encode(TEXTS) == want  # ... which the codec does not inherit


def test_draft_cache_gives_the_logits_of_a_fresh_forward(monkeypatch):
    import specdecode.drafters.tokenizer_bridge as bridge

    repacks = []
    gather = bridge.kv_cache.gather_columns
    monkeypatch.setattr(bridge.kv_cache, "gather_columns", lambda *a, **k: repacks.append(1) or gather(*a, **k))
    model = make_model("llama", layers=1, seed=3)
    cache = _DraftCache(model, torch.device("cpu"), True)
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(3, 128, (n,), generator=g).tolist() for n in (5, 1, 9)]
    cache.start(len(rows))

    def fresh(row):
        with torch.no_grad():
            return model(torch.tensor([row])).logits[0, -1]

    for step in range(40):
        # each row keeps a random prefix of what it has, then gains a few random tokens
        for r, row in enumerate(rows):
            keep = int(torch.randint(max(len(row) - 3, 1), len(row) + 1, (1,), generator=g))
            rows[r] = row[:keep] + torch.randint(3, 128, (int(torch.randint(1, 4, (1,), generator=g)),),
                                                 generator=g).tolist()
        logits = cache.sync(rows)
        for r, row in enumerate(rows):
            assert torch.allclose(logits[r], fresh(row), atol=1e-4), (step, r)
        extra = torch.randint(3, 128, (len(rows),), generator=g).tolist()
        logits = cache.feed_one(torch.tensor(extra))  # a drafted token per row
        rows = [row + [t] for row, t in zip(rows, extra)]
        for r, row in enumerate(rows):
            assert torch.allclose(logits[r], fresh(row), atol=1e-4), (step, r)
        if step == 20:  # the middle row leaves
            cache.keep_rows([0, 2])
            rows = [rows[0], rows[2]]
    # 40 steps of roll-backs left holes; they were re-packed, not accumulated
    assert repacks and cache.width < max(len(r) for r in rows) + 2 * REPACK_MIN_WASTE


# ------------------------------------------------------------------ whole generations


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_perfect_draft_through_a_permuted_tokenizer_is_always_accepted(arch):
    """The draft is the target itself behind a permuted tokenizer: through the text round trip
    it must propose the target's own greedy tokens."""
    target, _ = make_pair(arch)
    tok = word_tokenizer(WORDS)
    perm = permutation(len(tok), 0, seed=1)
    drafter = TokenizerBridgeDrafter(permuted_model(target, perm), permuted_tokenizer(tok, perm), tok)
    for lengths in ([7], [5, 9, 3]):
        ids, mask = left_padded(lengths, seed=len(lengths))
        want = hf_greedy(target, ids, mask, 20)
        out = specdecode.generate(target, drafter, ids, mask, num_draft_tokens=3, max_new_tokens=20,
                                  pad_token_id=PAD, draft_schedule="constant")
        assert torch.equal(out.sequences, want)
        assert out.stats.drafter == "tokenizer-bridge"
        assert out.stats.drafted_tokens >= 10 * len(lengths)
        assert out.stats.acceptance_rate > 0.9


def test_demo_pair_through_a_permuted_tokenizer_drafts_as_the_model_drafter_does():
    target, draft, tok = specdecode.load_demo_pair()
    from specdecode.demo import demo_prompts

    perm = permutation(len(tok), 1, seed=2)  # id 0 (<|endoftext|>) stays
    ptok = permuted_tokenizer(tok, perm)
    assert ptok("def f(x):").input_ids != tok("def f(x):").input_ids
    with pytest.raises(ValueError, match="TokenizerBridgeDrafter"):
        specdecode.check_compatibility(target, permuted_model(draft, perm), target_tokenizer=tok,
                                       draft_tokenizer=ptok)
    bridge = TokenizerBridgeDrafter(permuted_model(draft, perm), ptok, tok)
    tok.padding_side = "left"
    batch = tok([t[-160:] for t in demo_prompts(3)], return_tensors="pt", padding=True)
    common = dict(num_draft_tokens=4, max_new_tokens=24, eos_token_id=None, pad_token_id=0, draft_schedule="constant")
    plain = specdecode.generate(target, draft, batch.input_ids, batch.attention_mask, **common)
    bridged = specdecode.generate(target, bridge, batch.input_ids, batch.attention_mask, **common)
    want = target.generate(batch.input_ids, attention_mask=batch.attention_mask, max_new_tokens=24,
                           do_sample=False, pad_token_id=0, eos_token_id=None)
    assert torch.equal(bridged.sequences, want) and torch.equal(plain.sequences, want)
    assert bridged.stats.acceptance_rate > 0.3
    assert abs(bridged.stats.acceptance_rate - plain.stats.acceptance_rate) < 0.1


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_different_segmentations_give_the_targets_greedy_output(tokenizers, arch):
    """Byte-level BPE target, SentencePiece-style BPE draft with its own vocabulary size; a row
    that ends early (EOS) leaves the batch and the draft's cache."""
    target_tok, draft_tok = tokenizers["bytelevel"], tokenizers["metaspace"]
    target = make_model(arch, vocab=len(target_tok), seed=1, init=0.3 if arch != "gpt2" else 0.08)
    draft = make_model("llama", vocab=len(draft_tok), layers=1, seed=2)
    drafter = TokenizerBridgeDrafter(draft, draft_tok, target_tok)
    target_tok.padding_side = "left"
    batch = target_tok([t[:90] for t in corpus()[:3]], return_tensors="pt", padding=True)
    for ids, mask in ((batch.input_ids[:1, -20:], None), (batch.input_ids, batch.attention_mask)):
        want = hf_greedy(target, ids, mask if mask is not None else torch.ones_like(ids), 16)
        out = specdecode.generate(target, drafter, ids, mask, num_draft_tokens=3, max_new_tokens=16,
                                  pad_token_id=PAD)
        assert torch.equal(out.sequences, want)
        assert out.stats.drafted_tokens > 0
    # EOS = a token row 1 emits early: that row finishes first
    eos = int(want[1, batch.input_ids.shape[1] + 2])
    want = hf_greedy(target, batch.input_ids, batch.attention_mask, 16, eos_token_id=eos)
    out = specdecode.generate(target, drafter, batch.input_ids, batch.attention_mask, num_draft_tokens=3,
                              max_new_tokens=16, pad_token_id=PAD, eos_token_id=eos)
    assert torch.equal(out.sequences, want)


def test_through_custom_generate():
    target, _ = make_pair("llama")
    tok = word_tokenizer(WORDS)
    perm = permutation(len(tok), 0, seed=3)
    drafter = TokenizerBridgeDrafter(permuted_model(target, perm), permuted_tokenizer(tok, perm), tok)
    ids, mask = left_padded([4, 6], seed=5)
    seq = target.generate(ids, attention_mask=mask, custom_generate=specdecode.custom_generate,
                          draft_model=drafter, num_draft_tokens=2, max_new_tokens=12, do_sample=False,
                          pad_token_id=PAD)
    assert torch.equal(seq, hf_greedy(target, ids, mask, 12))


def test_a_plain_draft_with_another_tokenizer_is_still_refused():
    target, draft = make_pair("llama")
    tok = word_tokenizer(WORDS)
    perm = permutation(len(tok), 0, seed=4)
    ids, mask = left_padded([4, 6])
    with pytest.raises(ValueError, match="TokenizerBridgeDrafter"):
        specdecode.generate(target, permuted_model(draft, perm), ids, mask, target_tokenizer=tok,
                            draft_tokenizer=permuted_tokenizer(tok, perm), max_new_tokens=4)


# ------------------------------------------------------------------ sampling


# An 8-word vocabulary for the sampling pair.
SAMPLING_WORDS = ["a", "b", "c", "d", "e", "f", "g", "h"]


class UniformClaimingBridge(TokenizerBridgeDrafter):
    """Broken: the bridged proposal verified as if it had been drawn from a uniform q."""

    def propose(self, state, num_tokens):
        proposal = super().propose(state, num_tokens)
        b, k = proposal.draft_tokens.shape
        proposal.draft_logits = torch.zeros((b, k, state.vocab_size), device=state.device)
        return proposal


@pytest.fixture(scope="module")
def sampling_bridge(sampling_pair):
    target, draft = sampling_pair
    tok = word_tokenizer(SAMPLING_WORDS)
    perm = permutation(V, 0, seed=5)
    return tok, permuted_model(draft, perm), permuted_tokenizer(tok, perm)


def sample(target, drafter, rule, n=20000, seed=3):
    ids = torch.tensor([PROMPT]).expand(n, -1)
    return specdecode.generate(target, drafter, ids, num_draft_tokens=2, rule=rule, do_sample=True,
                               max_new_tokens=K, eos_token_id=[], pad_token_id=PAD,
                               generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("rule", ["token", "block"])
def test_sampling_is_lossless_and_a_uniform_q_claim_is_not(sampling_pair, sampling_bridge, rule):
    target, _ = sampling_pair
    tok, draft, draft_tok = sampling_bridge
    joint = exact_joint(target, PROMPT)
    out = sample(target, TokenizerBridgeDrafter(draft, draft_tok, tok), rule)
    assert 0.05 < out.stats.acceptance_rate < 0.95 and out.stats.drafted_tokens > 10000
    assert chi_square_p(out.sequences[:, len(PROMPT):], joint) > PASS_P
    broken = sample(target, UniformClaimingBridge(draft, draft_tok, tok), rule, n=4000)
    assert chi_square_p(broken.sequences[:, len(PROMPT):], joint) < FAIL_P


# ------------------------------------------------------------------ bad arguments


def test_bad_arguments_name_the_argument():
    target, draft = make_pair("llama")
    tok = word_tokenizer(WORDS)
    with pytest.raises(TypeError, match="draft_model"):
        TokenizerBridgeDrafter("not a model", tok, tok)
    with pytest.raises(TypeError, match="draft_tokenizer"):
        TokenizerBridgeDrafter(draft, object(), tok)
    with pytest.raises(TypeError, match="target_tokenizer"):
        TokenizerBridgeDrafter(draft, tok, "gpt2")
    with pytest.raises(ValueError, match="draft_tokenizer"):
        TokenizerBridgeDrafter(draft, word_tokenizer([f"w{i}" for i in range(200)]), tok)
    with pytest.raises(ValueError, match="draft_tokens_per_step"):
        TokenizerBridgeDrafter(draft, tok, tok, draft_tokens_per_step=0)
    with pytest.raises(TypeError, match="draft_tokens_per_step"):
        TokenizerBridgeDrafter(draft, tok, tok, draft_tokens_per_step=2.5)
