"""``TokenizerBridgeDrafter``: a draft model with its own tokenizer drafts through text.

Each step, for every row: the committed target tokens are decoded to text and re-encoded with
the draft tokenizer; the draft model continues that text greedily; its new tokens are decoded
to text, and that text is encoded with the target tokenizer *after* the row's committed target
tokens. Those target tokens are the proposal, a deterministic function of the context,
verified against a point mass.

The draft model keeps a KV cache per row and, each step, runs only the draft tokens after the
longest common prefix of what it holds and the new encoding of the context (usually the
accepted part of its own last draft plus one token). The context's text is decoded and encoded
again in full at each step (batched, in the tokenizers' Rust code: linear in the context, small
next to a model forward); the draft's text crosses back to target tokens through a short
*anchor* of the context's last tokens, so that merges and spaces at the boundary are the
tokenizer's own.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from specdecode.drafters.base import CommitUpdate, DrafterBase, DraftState, Proposal
from specdecode.models import facts, kv_cache

# Tokens before a boundary that are decoded / re-encoded with the text after it, so that the
# tokenizers see the context they merge and space by.
ANCHOR_TOKENS = 4
# Re-pack the draft cache when at least this many columns (and half of them) are holes.
REPACK_MIN_WASTE = 32


class TextCodec:
    """Batched encode / decode with one tokenizer, as its Hugging Face methods do (no special
    tokens added, no clean-up of spaces), calling a fast tokenizer's Rust backend directly when
    that is equivalent (the Python wrapper costs more than the tokenization on short texts).
    The backend is used only while it has no padding or truncation set (a user's call with
    ``padding=True`` leaves it so) and when it agrees with the wrapper on a probe text."""

    PROBE = "def f(x):\n    return  x + 1  # é"

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self.backend = backend if hasattr(backend, "encode_batch") and hasattr(backend, "decode_batch") else None
        if self.backend is not None and self._backend_usable():
            ids = tokenizer(self.PROBE, add_special_tokens=False)["input_ids"]
            agrees = (self.backend.encode_batch([self.PROBE], add_special_tokens=False)[0].ids == ids
                      and self.backend.decode_batch([ids], skip_special_tokens=True)
                      == tokenizer.batch_decode([ids], skip_special_tokens=True, clean_up_tokenization_spaces=False))
            if not agrees:
                self.backend = None

    @staticmethod
    def of(tokenizer: Any) -> "TextCodec":
        return tokenizer if isinstance(tokenizer, TextCodec) else TextCodec(tokenizer)

    def _backend_usable(self) -> bool:
        b = self.backend
        return (b is not None and b.padding is None and b.truncation is None
                and bool(b.encode_special_tokens) == bool(getattr(self.tokenizer, "split_special_tokens", False)))

    def decode(self, rows: list[list[int]], skip_special_tokens: bool = False) -> list[str]:
        if self._backend_usable():
            return self.backend.decode_batch(rows, skip_special_tokens=skip_special_tokens)
        return self.tokenizer.batch_decode(rows, skip_special_tokens=skip_special_tokens,
                                           clean_up_tokenization_spaces=False)

    def encode(self, texts: list[str], add_special_tokens: bool = False) -> list[list[int]]:
        if not texts:
            return []
        if self._backend_usable():
            return [e.ids for e in self.backend.encode_batch(texts, add_special_tokens=add_special_tokens)]
        return self.tokenizer(texts, add_special_tokens=add_special_tokens)["input_ids"]


def texts_after(tokenizer: Any | TextCodec, contexts: list[list[int]], new: list[list[int]]) -> list[str]:
    """Per row, the text that the tokens ``new[r]`` add after ``contexts[r]`` (special tokens
    dropped).

    Decoding ``new[r]`` alone can lose or change characters at the boundary (a leading space
    that a SentencePiece-style decoder strips at the start of a text, the bytes of a character
    split over two tokens), so it is decoded after an anchor of the context's last tokens,
    whose own text is then removed.
    """
    codec = TextCodec.of(tokenizer)
    anchors = [c[-ANCHOR_TOKENS:] for c in contexts]
    heads = codec.decode(anchors, skip_special_tokens=True)
    fulls = codec.decode([a + n for a, n in zip(anchors, new)], skip_special_tokens=True)
    alone = codec.decode(new, skip_special_tokens=True)
    return [full[len(head):] if anchor and full.startswith(head) else text
            for anchor, head, full, text in zip(anchors, heads, fulls, alone)]


def _anchor_texts(codec: TextCodec, contexts: list[list[int]]) -> list[str]:
    """The text of each context's last ``ANCHOR_TOKENS`` tokens as it reads inside the
    context: decoded after one more token, whose text is removed (a SentencePiece-style
    decoder drops the leading space of whatever token comes first)."""
    anchors = [c[-ANCHOR_TOKENS:] for c in contexts]
    leads = [c[-ANCHOR_TOKENS - 1: -ANCHOR_TOKENS] if len(c) > ANCHOR_TOKENS else [] for c in contexts]
    lead_texts = codec.decode(leads)
    fulls = codec.decode([lead + a for lead, a in zip(leads, anchors)])
    alone = codec.decode(anchors)
    return [full[len(lead_text):] if lead and full.startswith(lead_text) else text
            for lead, lead_text, full, text in zip(leads, lead_texts, fulls, alone)]


def tokens_after(tokenizer: Any | TextCodec, contexts: list[list[int]], texts: list[str]) -> list[list[int] | None]:
    """Per row, the tokens that encode ``texts[r]`` right after ``contexts[r]``, or None when
    the encoding has no token boundary where the text starts.

    The context's last tokens (an anchor) are decoded in place, and their text is encoded
    alone and together with the new text. When the joint encoding starts with the anchor
    itself, or with the anchor text's own encoding (a context that was not tokenized
    canonically, or a decoder that drops a leading space), the tokens after that prefix are
    the answer. Otherwise the boundary falls inside a token (the text merges with the
    context's last token) and there is none. The answer's last token may stop in the middle
    of a longer token that more text would form: callers drop it unless the text is complete.
    """
    codec = TextCodec.of(tokenizer)
    heads = _anchor_texts(codec, contexts)
    joint = codec.encode([h + t for h, t in zip(heads, texts)])
    alone = codec.encode(heads)
    out: list[list[int] | None] = []
    for context, ids, head_ids in zip(contexts, joint, alone):
        anchor = context[-ANCHOR_TOKENS:]
        if ids[: len(anchor)] == anchor:
            out.append(ids[len(anchor):])
        elif ids[: len(head_ids)] == head_ids:
            out.append(ids[len(head_ids):])
        else:
            out.append(None)
    return out


class _DraftCache:
    """The draft model's KV cache over a batch of rows of different lengths.

    Rows share cache columns; ``mask [b, C]`` marks each row's real tokens (1) against holes
    (0: columns other rows used, or tokens a row rolled back). ``ids[r]`` lists row ``r``'s real
    tokens in order and ``columns[r]`` their columns; a token's position id is its index in
    ``ids[r]``. New tokens are fed right-aligned in one block per forward, so every row's last
    fed token is in the last column.
    """

    def __init__(self, model: torch.nn.Module, device: torch.device, logits_to_keep_ok: bool) -> None:
        self.model = model
        self.device = device
        self.logits_to_keep_ok = logits_to_keep_ok
        self.cache: Any = None
        self.mask = torch.zeros((0, 0), dtype=torch.long, device=device)
        self.ids: list[list[int]] = []
        self.columns: list[list[int]] = []

    @property
    def width(self) -> int:
        return int(self.mask.shape[1])

    def start(self, batch_size: int) -> None:
        self.cache = kv_cache.new_cache()
        self.mask = torch.zeros((batch_size, 0), dtype=torch.long, device=self.device)
        self.ids = [[] for _ in range(batch_size)]
        self.columns = [[] for _ in range(batch_size)]

    def keep_rows(self, index: list[int]) -> None:
        if self.cache is not None and kv_cache.num_columns(self.cache) > 0:
            kv_cache.select_rows(self.cache, torch.tensor(index, dtype=torch.long, device=self.device))
        self.mask = self.mask[torch.tensor(index, dtype=torch.long, device=self.device)]
        self.ids = [self.ids[i] for i in index]
        self.columns = [self.columns[i] for i in index]

    def sync(self, wanted: list[list[int]]) -> Tensor:
        """Make every row hold ``wanted[r]`` (non-empty) and return the logits after its last
        token ``[b, V]``: each row keeps the longest common prefix of what it holds and
        ``wanted[r]`` (short of the last token, whose logits are needed), the rest is rolled
        back and the difference is fed in one forward."""
        holes: list[tuple[int, int]] = []
        new: list[list[int]] = []
        for r, want in enumerate(wanted):
            have = self.ids[r]
            limit = min(len(have), len(want) - 1)
            keep = 0
            while keep < limit and have[keep] == want[keep]:
                keep += 1
            holes.extend((r, c) for c in self.columns[r][keep:])
            del have[keep:], self.columns[r][keep:]
            new.append(want[keep:])
        if holes:
            rows, cols = zip(*holes)
            self.mask[list(rows), list(cols)] = 0
        return self.feed(new)

    def feed(self, new: list[list[int]]) -> Tensor:
        """Append ``new[r]`` (non-empty) to every row; returns the logits after each row's last
        token ``[b, V]``."""
        self._trim()
        b, m = len(new), max(len(n) for n in new)
        start = self.width
        block, block_mask, positions = [], [], []
        for r, tokens in enumerate(new):
            n, have = len(tokens), len(self.ids[r])
            block.append([0] * (m - n) + tokens)
            block_mask.append([0] * (m - n) + [1] * n)
            positions.append([0] * (m - n) + list(range(have, have + n)))
            self.columns[r].extend(range(start + m - n, start + m))
            self.ids[r].extend(tokens)
        block_mask = torch.tensor(block_mask, dtype=torch.long)
        self.mask = torch.cat([self.mask, block_mask.to(self.device)], 1)
        mask = None if bool(self.mask.all()) else self.mask
        logits = facts.forward(self.model, torch.tensor(block, dtype=torch.long, device=self.device), mask,
                               torch.tensor(positions, dtype=torch.long, device=self.device), self.cache,
                               last_only=True, logits_to_keep_ok=self.logits_to_keep_ok)
        return logits

    def feed_one(self, tokens: Tensor) -> Tensor:
        """Append one token per row (``tokens [b]``); returns the logits after it ``[b, V]``."""
        self._trim()
        start = self.width
        positions = torch.tensor([len(ids) for ids in self.ids], dtype=torch.long, device=self.device)
        for ids, columns, token in zip(self.ids, self.columns, tokens.tolist()):
            ids.append(token)
            columns.append(start)
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], 1)
        mask = None if bool(self.mask.all()) else self.mask
        return facts.forward(self.model, tokens.to(self.device)[:, None], mask, positions[:, None], self.cache,
                             last_only=True, logits_to_keep_ok=self.logits_to_keep_ok)

    def _trim(self) -> None:
        """Drop trailing columns no row uses; re-pack the rows when holes waste enough."""
        used = self.mask.any(0).nonzero()
        width = int(used[-1]) + 1 if used.numel() else 0
        if width < self.width:
            kv_cache.crop(self.cache, width)
            self.mask = self.mask[:, :width]
        real = [len(ids) for ids in self.ids]
        longest = max(real, default=0)
        waste = self.width - longest
        if waste >= REPACK_MIN_WASTE and waste * 2 >= self.width and longest > 0:
            order = torch.tensor([[c for c in [0] * (longest - len(cols))] + cols for cols in self.columns],
                                 dtype=torch.long, device=self.device)
            kv_cache.gather_columns(self.cache, order)
            self.mask = (torch.arange(longest, device=self.device)[None, :]
                         >= torch.tensor([longest - n for n in real], device=self.device)[:, None]).long()
            self.columns = [list(range(longest - n, longest)) for n in real]


def _contexts(state: DraftState) -> list[list[int]]:
    """Every row's committed tokens (``state.contexts()``), read from the column layout in one
    gather: the real columns of a row are its prompt and emitted tokens, in order."""
    columns = state.num_columns
    real = state.attention_mask[:, :columns].bool()
    flat = state.tokens[:, :columns][real].tolist()
    out, start = [], 0
    for n in real.sum(1).tolist():
        out.append(flat[start: start + n])
        start += n
    return out


class TokenizerBridgeDrafter(DrafterBase):
    """Drafts with ``draft_model``, a Hugging Face causal LM whose tokenizer
    (``draft_tokenizer``) differs from the target's (``target_tokenizer``), by going through
    text.

    At each step, for every row: the committed target tokens are decoded (special tokens
    dropped) and encoded with the draft tokenizer; the draft model extends them greedily by
    ``draft_tokens_per_step`` tokens (stopping at its EOS); the text of those tokens is encoded
    with the target tokenizer right after the row's committed target tokens (through an anchor
    of the last few tokens, so merges and spaces at the boundary are the tokenizer's own), and
    the last of them is dropped, since more text could still change it. Up to ``k`` of the
    remaining tokens are proposed. A row whose draft text would merge into the last committed
    target token proposes nothing that step.

    The proposal is deterministic given the context (no coins are used), so verification treats
    it as a point mass: sampling stays exactly the target's distribution under every lossless
    rule, and at temperature 0 the output is the target's greedy output. The target's logits
    processors do not apply to the draft, whose vocabulary is another one.

    The draft keeps a KV cache per row; each step it feeds only the tokens after the longest
    common prefix of what it holds and the context's new encoding.

    Args:
        draft_model: a Hugging Face decoder-only causal LM.
        draft_tokenizer: the draft model's Hugging Face tokenizer.
        target_tokenizer: the target model's Hugging Face tokenizer.
        draft_tokens_per_step: draft-model tokens generated per step; None: enough for ``k + 1``
            target tokens at the ratio of draft to target tokens measured on the contexts.

    Example:
        >>> drafter = TokenizerBridgeDrafter(draft, draft_tok, target_tok)
        >>> out = specdecode.generate(target, drafter, input_ids, num_draft_tokens=4)
    """

    name = "tokenizer-bridge"
    #: On the static decode path it proposes on the host between steps (its draft model runs
    #: eagerly with its own cache), feeding a static, compiled or graphed target step.
    static_host_drafts = True

    def __init__(self, draft_model: torch.nn.Module, draft_tokenizer: Any, target_tokenizer: Any,
                 draft_tokens_per_step: int | None = None) -> None:
        facts.check_model("draft_model", draft_model)
        for arg, tok in (("draft_tokenizer", draft_tokenizer), ("target_tokenizer", target_tokenizer)):
            if not (callable(tok) and hasattr(tok, "decode") and hasattr(tok, "get_vocab")):
                raise TypeError(f"{arg}: expected a Hugging Face tokenizer (callable, with decode and get_vocab), "
                                f"got {type(tok).__name__}")
        rows = int(draft_model.get_input_embeddings().weight.shape[0])
        self.draft_vocab = min(len(draft_tokenizer), facts.vocab_rows(draft_model))
        if len(draft_tokenizer) > rows:
            raise ValueError(
                f"draft_tokenizer: has {len(draft_tokenizer)} tokens but draft_model embeds only {rows}: "
                "pass the draft model's own tokenizer"
            )
        if draft_tokens_per_step is not None:
            if isinstance(draft_tokens_per_step, bool) or not isinstance(draft_tokens_per_step, int):
                raise TypeError(f"draft_tokens_per_step: expected an int >= 1 or None, got {draft_tokens_per_step!r}")
            if draft_tokens_per_step < 1:
                raise ValueError(f"draft_tokens_per_step: expected an int >= 1 or None, got {draft_tokens_per_step}")
        self.model = draft_model
        self.draft_tokenizer = draft_tokenizer
        self.target_tokenizer = target_tokenizer
        self.draft_tokens_per_step = draft_tokens_per_step
        self.draft_codec, self.target_codec = TextCodec(draft_tokenizer), TextCodec(target_tokenizer)
        self.device = facts.input_device(draft_model)
        eos = getattr(draft_tokenizer, "eos_token_id", None)
        self.draft_eos = set() if eos is None else {int(eos)}
        start = getattr(draft_tokenizer, "bos_token_id", None)
        self.draft_start = int(start) if start is not None else (int(eos) if eos is not None else 0)
        self.cache = _DraftCache(draft_model, self.device, facts.accepts_logits_to_keep(draft_model))
        self.reset()

    def reset(self) -> None:
        self.cache.cache = None

    def describe(self) -> dict:
        n = sum(p.numel() for p in self.model.parameters())
        return {"drafter": self.name, "draft_model": type(self.model).__name__, "draft_params": n,
                "draft_vocab": self.draft_vocab}

    def _steps(self, num_tokens: int, draft_lengths: list[int], target_lengths: list[int]) -> int:
        if self.draft_tokens_per_step is not None:
            return self.draft_tokens_per_step
        ratio = sum(draft_lengths) / max(sum(target_lengths), 1)
        return max(1, min(math.ceil((num_tokens + 1) * ratio), 4 * (num_tokens + 1)))

    @torch.no_grad()
    def propose(self, state: DraftState, num_tokens: int) -> Proposal:
        contexts = _contexts(state)
        b = len(contexts)
        prefilling = self.cache.cache is None
        if prefilling:
            self.cache.start(b)
        t0 = state.clock() if prefilling else 0.0
        texts = self.target_codec.decode(contexts, skip_special_tokens=True)
        encoded = self.draft_codec.encode(texts, add_special_tokens=True)
        wanted = [ids if ids else [self.draft_start] for ids in encoded]
        steps = self._steps(num_tokens, [len(w) for w in wanted], [len(c) for c in contexts])
        logits = self.cache.sync(wanted)
        prefill_seconds = state.clock() - t0 if prefilling else 0.0
        drafted: list[Tensor] = []
        for i in range(steps):
            drafted.append(logits[:, : self.draft_vocab].argmax(-1))
            if i + 1 < steps:
                logits = self.cache.feed_one(drafted[-1])
        draft_ids = torch.stack(drafted, 1).tolist()

        complete = [False] * b
        for r, ids in enumerate(draft_ids):
            for j, t in enumerate(ids):
                if t in self.draft_eos:  # the draft ended its text: nothing after it counts
                    draft_ids[r], complete[r] = ids[:j], True
                    break
        new_texts = texts_after(self.draft_codec, wanted, draft_ids)
        mapped = tokens_after(self.target_codec, contexts, new_texts)
        proposals: list[list[int]] = []
        for tokens, text, done in zip(mapped, new_texts, complete):
            if not text or not tokens:
                proposals.append([])
                continue
            if not done:
                tokens = tokens[:-1]  # more draft text could still change the last token
            tokens = tokens[:num_tokens]
            for j, t in enumerate(tokens):
                if not 0 <= t < state.vocab_size:
                    tokens = tokens[:j]
                    break
            proposals.append(tokens)
        longest = max((len(p) for p in proposals), default=0)
        draft_tokens = torch.tensor([p + [0] * (longest - len(p)) for p in proposals], dtype=torch.long)
        counts = torch.tensor([len(p) for p in proposals], dtype=torch.long)
        return Proposal(draft_tokens.reshape(b, longest).to(state.device), None, counts.to(state.device),
                        forward_calls=steps, prefill_seconds=prefill_seconds)

    def commit(self, update: CommitUpdate) -> None:
        # The next proposal re-reads the committed context; only the rows that left matter here.
        if update.kept_rows is not None and self.cache.cache is not None:
            self.cache.keep_rows(update.kept_rows.tolist())
