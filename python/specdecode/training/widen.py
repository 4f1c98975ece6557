"""Default prompts widened beyond the request templates, mixed by source.

A drafter learns the target on the prompts it is trained on; the templates of
:mod:`specdecode.training.prompts` are many but alike, and held-out requests are not templated.
A :class:`PromptMix` names the share of each source in the run's ``num_prompts``:

* ``templates``: the kit's default prompts (:func:`~specdecode.training.data.default_prompts`);
* ``self-instruct``: requests the target writes itself (as in Self-Instruct, Wang et al. 2022):
  asked for a list of requests about a seed topic
  (:data:`~specdecode.training.prompt_sources.SEED_TOPICS`), its answer is begun with three
  numbered requests drawn from the templates, and it continues the list (a small chat model
  follows a list far better than an instruction to write one request); each complete numbered
  line is a candidate, kept when it reads as one request (3 to 60 words, mostly letters) and is
  no near-copy (ROUGE-L below 0.7) of a request kept on the same topic, nor a copy of any kept
  request, nor a near-copy of the benchmark's prompts;
* ``multi-turn``: two-turn exchanges: a templated request, the target's own answer, then a
  follow-up (:data:`~specdecode.training.prompt_sources.FOLLOW_UPS`); the target's second
  answer is what is learned;
* ``code``, ``prose``, ``long``: requests on code snippets, on paragraphs, and requests whose
  answers are long (:mod:`specdecode.training.prompt_sources`; with ``max_new_tokens`` of the
  data settings raised, e.g. ``--max-new-tokens 256 --max-length 384``, the answers are long
  too).

The target's sources are generated in batches of the data settings' ``batch_size`` (fast on a
GPU), then the prompts are cached beside the data (``prompts-<hash>.json``), so a second run
reuses them. Whatever a source could not make in time is made up with templates.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from specdecode.training.data import DataSettings, continue_prompts, default_prompts, encode_prompt
from specdecode.training.device import data_batch_size
from specdecode.training.prompt_sources import (
    FOLLOW_UPS,
    SEED_TOPICS,
    content_words,
    is_held_out,
    near_copy,
    static_source,
)

__all__ = ["SOURCES", "PromptMix", "mixed_prompts", "multi_turn", "parse_request", "parse_requests", "self_instruct"]

#: Source names, as written in a mix's text (``self-instruct``) and as fields (``self_instruct``).
SOURCES: tuple[str, ...] = ("templates", "self-instruct", "multi-turn", "code", "prose", "long")
_REQUEST_TOKENS = 64  # the most new tokens of a self-instruct reply (a few numbered lines)
_ANSWER_TOKENS = 64  # the most new tokens of a multi-turn exchange's first answer
_TRIES = 4  # self-instruct replies asked for per request wanted, at most


@dataclass(frozen=True)
class PromptMix:
    """Shares of the default prompts by source (any non-negative numbers, not all zero; they
    are normalised)."""

    templates: float = 1.0
    self_instruct: float = 0.0
    multi_turn: float = 0.0
    code: float = 0.0
    prose: float = 0.0
    long: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or value != value:
                raise ValueError(f"prompt_mix: {f.name.replace('_', '-')} expected a number >= 0, got {value!r}")
        if sum(getattr(self, f.name) for f in fields(self)) <= 0:
            raise ValueError("prompt_mix: at least one source needs a share > 0")

    @classmethod
    def parse(cls, text: str) -> PromptMix:
        """A mix from text such as ``"templates=0.5,self-instruct=0.3,multi-turn=0.2"`` (sources
        not named get 0), or ``ValueError`` naming ``prompt_mix``."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"prompt_mix: expected SOURCE=SHARE,... with sources among {', '.join(SOURCES)}, "
                             f"got {text!r}")
        shares: dict[str, float] = {f.name: 0.0 for f in fields(cls)}
        for part in text.split(","):
            name, _, value = part.partition("=")
            name = name.strip()
            if name not in SOURCES or not value.strip():
                raise ValueError(f"prompt_mix: expected SOURCE=SHARE with sources among {', '.join(SOURCES)}, "
                                 f"got {part.strip()!r}")
            try:
                shares[name.replace("-", "_")] = float(value)
            except ValueError:
                raise ValueError(f"prompt_mix: {name} expected a number, got {value.strip()!r}") from None
        return cls(**shares)

    def counts(self, total: int) -> dict[str, int]:
        """Prompts per source for ``total`` prompts (largest remainders; sources with share 0 get none)."""
        shares = {f.name: float(getattr(self, f.name)) for f in fields(self)}
        whole = sum(shares.values())
        exact = {name: total * share / whole for name, share in shares.items()}
        out = {name: int(value) for name, value in exact.items()}
        for name in sorted(exact, key=lambda n: (out[n] - exact[n], n))[: total - sum(out.values())]:
            out[name] += 1
        return out

    def text(self) -> str:
        """The mix as :meth:`parse` reads it."""
        return ",".join(f"{f.name.replace('_', '-')}={getattr(self, f.name):g}" for f in fields(self)
                        if getattr(self, f.name) > 0)


def parse_request(reply: str) -> str | None:
    """The request in a self-instruct reply (its first line, numbering, bullets, a "Request:"
    label and quotes removed), or None when it does not read as one request."""
    line = next((part.strip() for part in reply.splitlines() if part.strip()), "")
    line = re.sub(r"^(\d+[.)]|[-*\u2022])\s*", "", line)
    line = re.sub(r"^(new )?request\s*:\s*", "", line, flags=re.IGNORECASE).strip().strip("\"'\u201c\u201d").strip()
    words = line.split()
    letters = sum(ch.isalpha() for ch in line)
    if not 3 <= len(words) <= 60 or letters < 0.6 * len(line.replace(" ", "")):
        return None
    return line


def _sized(settings: DataSettings, target: Any) -> DataSettings:
    """``settings`` with a batch size (sized for the target's device when it has none)."""
    if settings.batch_size is not None:
        return settings
    return replace(settings, batch_size=data_batch_size(target, settings.max_length))


def parse_requests(reply: str) -> list[str]:
    """The requests of a self-instruct reply, the continuation of a numbered list after "4.":
    its first line, then every line that starts with a number, each read by
    :func:`parse_request`; a last line not ended by a newline is kept only when it ends a
    sentence (else the reply was cut inside it)."""
    lines = reply.split("\n")
    last_cut = not lines[-1].rstrip().endswith((".", "?", "!"))
    candidates = [lines[0]] + [line for line in lines[1:] if re.match(r"^\s*\d+[.)]\s", line)]
    if last_cut and candidates and candidates[-1] is lines[-1]:
        candidates.pop()
    return [r for r in (parse_request(line) for line in candidates) if r is not None]


def _generate(target: Any, tokenizer: Any, prompts: list[list[int]], settings: DataSettings, seed: int,
              desc: str, progress: bool, deadline: float | None) -> list[str | None]:
    """The target's replies to ``prompts`` (text, special tokens dropped), in batches of
    ``settings.batch_size``; None for the prompts not reached by ``deadline``."""
    replies: list[str | None] = [None] * len(prompts)
    size = settings.batch_size
    bar = tqdm(total=len(prompts), desc=desc, unit="prompt", disable=not progress, leave=False)
    for start in range(0, len(prompts), size):
        if start and deadline is not None and time.monotonic() > deadline:
            break
        chunk = prompts[start: start + size]
        done = continue_prompts(target, chunk, settings, seed * 7_919 + start)
        for i, (prompt, full) in enumerate(zip(chunk, done)):
            replies[start + i] = tokenizer.decode(full[len(prompt):], skip_special_tokens=True)
        bar.update(len(chunk))
    bar.close()
    return replies


def _list_prompt(tokenizer: Any, examples: list[str], topic: str) -> list[int]:
    """A request for a list of requests about ``topic``, its answer begun with ``examples``
    numbered 1 to 3 and "4." (through the chat template when the tokenizer has one)."""
    ask = f"List requests that people send to an AI assistant about {topic}, one per line."
    begun = "".join(f"{i + 1}. {' '.join(text.split())}\n" for i, text in enumerate(examples)) + f"{len(examples) + 1}."
    if getattr(tokenizer, "chat_template", None):
        return encode_prompt(tokenizer, ask) + list(tokenizer(begun, add_special_tokens=False).input_ids)
    return list(tokenizer(f"{ask}\n{begun}").input_ids)


def self_instruct(target: Any, tokenizer: Any, count: int, pool: list[str], settings: DataSettings, *, seed: int = 0,
                  progress: bool = True, deadline: float | None = None) -> list[str]:
    """Up to ``count`` requests written by the target (see the module docstring), each list
    begun with three requests of ``pool``, about a seed topic. Deterministic for a seed on one
    device."""
    gen = torch.Generator().manual_seed(seed)
    cfg = replace(_sized(settings, target), max_new_tokens=_REQUEST_TOKENS, temperature=1.0)
    kept: list[str] = []
    by_topic: dict[str, list[str]] = {}  # near-copies are looked for among the same topic's requests
    words_seen: set[tuple[str, ...]] = set()  # and copies (the same content words) among all
    asked = 0
    while len(kept) < count and asked < _TRIES * count and (deadline is None or time.monotonic() < deadline):
        n = min(cfg.batch_size, _TRIES * count - asked)
        prompts, topics = [], []
        for _ in range(n):
            topics.append(SEED_TOPICS[int(torch.randint(len(SEED_TOPICS), (1,), generator=gen))])
            shown = [pool[int(i)] for i in torch.randint(len(pool), (3,), generator=gen)]
            prompts.append(_list_prompt(tokenizer, shown, topics[-1]))
        replies = _generate(target, tokenizer, prompts, cfg, seed + asked, "data: self-instruct", progress, deadline)
        asked += n
        for reply, topic in zip(replies, topics):
            same = by_topic.setdefault(topic, [])
            for request in [] if reply is None else parse_requests(reply):
                if tuple(content_words(request)) in words_seen or is_held_out(request) or any(
                        near_copy(request, k, 0.7) for k in same):
                    continue
                words_seen.add(tuple(content_words(request)))
                same.append(request)
                kept.append(request)
            if len(kept) >= count:
                break
    return kept[:count]


def _conversation_ids(tokenizer: Any, turns: list[tuple[str, str]]) -> list[int]:
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": r, "content": c} for r, c in turns], add_generation_prompt=True,
                                            tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    return list(tokenizer("\n\n".join(c for _, c in turns) + "\n").input_ids)


def multi_turn(target: Any, tokenizer: Any, firsts: list[str], settings: DataSettings, *, seed: int = 0,
               progress: bool = True, deadline: float | None = None) -> list[list[int]]:
    """Two-turn exchanges as token ids: each request of ``firsts``, the target's answer to it,
    a follow-up, and the generation prompt of the target's second answer. Exchanges whose
    first answer was not made by ``deadline`` are left out."""
    gen = torch.Generator().manual_seed(seed)
    cfg = replace(_sized(settings, target), max_new_tokens=min(_ANSWER_TOKENS, settings.max_new_tokens))
    answers = _generate(target, tokenizer, [encode_prompt(tokenizer, f) for f in firsts], cfg, seed,
                        "data: multi-turn answers", progress, deadline)
    out = []
    for first, answer in zip(firsts, answers):
        if answer is None or not answer.strip():
            continue
        follow = FOLLOW_UPS[int(torch.randint(len(FOLLOW_UPS), (1,), generator=gen))]
        out.append(_conversation_ids(tokenizer, [("user", first), ("assistant", answer.strip()), ("user", follow)]))
    return out


def _cache_key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def mixed_prompts(target: Any, tokenizer: Any, target_name: str, count: int, mix: PromptMix | str,
                  settings: DataSettings, cache_root: str | Path, *, seed: int = 0, progress: bool = True,
                  deadline: float | None = None) -> list[str | list[int]]:
    """``count`` prompts mixed from the sources of ``mix`` (a :class:`PromptMix` or its text),
    in a seeded order: text requests, and token ids for multi-turn exchanges. The target's
    sources stop at ``deadline`` (``time.monotonic()``) and templates make up what is missing.
    Cached under ``cache_root``."""
    if isinstance(mix, str):
        mix = PromptMix.parse(mix)
    if not isinstance(mix, PromptMix):
        raise TypeError(f"prompt_mix: expected a PromptMix or its text, got {type(mix).__name__}")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"num_prompts: expected an int >= 1, got {count!r}")
    from specdecode.training.artifacts import target_fingerprint

    wanted = mix.counts(count)
    settings = _sized(settings, target)
    key = _cache_key(target_fingerprint(target), target_name, mix.text(), count, seed, settings.max_new_tokens,
                     settings.temperature, settings.batch_size)
    file = Path(cache_root) / f"prompts-{key}.json"
    if file.is_file():
        return json.loads(file.read_text(encoding="utf-8"))["prompts"]
    pool = default_prompts(target_name, max(64, wanted["templates"] + wanted["multi_turn"]), seed + 1)
    parts: list[str | list[int]] = default_prompts(target_name, wanted["templates"], seed) if wanted["templates"] else []
    made = {"templates": len(parts)}
    split = None  # the time until ``deadline`` is shared by the two target sources, by their counts
    if deadline is not None and wanted["self_instruct"] and wanted["multi_turn"]:
        now = time.monotonic()
        split = now + max(0.0, deadline - now) * wanted["self_instruct"] / (wanted["self_instruct"] +
                                                                            wanted["multi_turn"])
    if wanted["self_instruct"]:
        written = self_instruct(target, tokenizer, wanted["self_instruct"], pool, settings, seed=seed,
                                progress=progress, deadline=split if split is not None else deadline)
        parts += written
        made["self-instruct"] = len(written)
    if wanted["multi_turn"]:
        exchanges = multi_turn(target, tokenizer, pool[: wanted["multi_turn"]], settings, seed=seed,
                               progress=progress, deadline=deadline)
        parts += exchanges
        made["multi-turn"] = len(exchanges)
    for name in ("code", "prose", "long"):
        if wanted[name]:
            parts += static_source(name, wanted[name], seed)
            made[name] = wanted[name]
    missing = count - len(parts)
    if missing > 0:
        parts += default_prompts(target_name, missing, seed + 2)
        made["templates"] += missing
    order = torch.randperm(len(parts), generator=torch.Generator().manual_seed(seed)).tolist()
    prompts = [parts[i] for i in order]
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps({"mix": mix.text(), "made": made, "prompts": prompts}) + "\n", encoding="utf-8")
    return prompts
