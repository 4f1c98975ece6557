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

The target's sources are best made once, ahead of the run (:func:`make_prompt_file`,
``python -m specdecode prompts``), into a prompt file (:mod:`specdecode.training.prompt_file`)
that a run draws them from (``prompts=``) without asking the target for anything; the kit ships
one for SmolLM2, used by default. Without a file the target writes them in the data stage, in
batches of the data settings' ``batch_size`` (fast on a GPU), and the prompts are cached beside
the data (``prompts-<hash>.json``), so a second run reuses them; whatever a source could not
make in time is made up with templates.
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
from specdecode.training.prompt_file import read_header, read_prompt_file, shipped_prompt_file
from specdecode.training.prompt_sources import (
    FOLLOW_UPS,
    SEED_TOPICS,
    content_words,
    is_held_out,
    near_copy,
    static_source,
)

__all__ = ["SOURCES", "PromptMix", "check_prompts_option", "conversation_ids", "file_mix", "make_prompt_file",
           "mixed_prompts", "multi_turn", "multi_turn_messages", "parse_request", "parse_requests", "self_instruct"]

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
    label and quotes removed), or None when it does not read as one request: 3 to 60 words,
    mostly letters, starting with a letter, at most two non-ASCII letters, brackets and
    double quotes paired."""
    line = next((part.strip() for part in reply.splitlines() if part.strip()), "")
    line = re.sub(r"^(\d+[.)]|[-*\u2022])\s*", "", line)
    line = re.sub(r"^(new )?request\s*:\s*", "", line, flags=re.IGNORECASE).strip().strip("\"'\u201c\u201d").strip()
    words = line.split()
    letters = sum(ch.isalpha() for ch in line)
    if not 3 <= len(words) <= 60 or letters < 0.6 * len(line.replace(" ", "")) or not line[0].isalpha():
        return None
    if sum(ch.isalpha() and not ch.isascii() for ch in line) > 2 or line.count('"') % 2 or any(
            line.count(a) != line.count(b) for a, b in ("()", "[]", "{}")):
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
    bar = tqdm(total=count, desc="self-instruct requests", unit="request", disable=not progress, leave=False)
    while len(kept) < count and asked < _TRIES * count and (deadline is None or time.monotonic() < deadline):
        n = min(cfg.batch_size, _TRIES * count - asked)
        prompts, topics = [], []
        for _ in range(n):
            topics.append(SEED_TOPICS[int(torch.randint(len(SEED_TOPICS), (1,), generator=gen))])
            shown = [pool[int(i)] for i in torch.randint(len(pool), (3,), generator=gen)]
            prompts.append(_list_prompt(tokenizer, shown, topics[-1]))
        replies = _generate(target, tokenizer, prompts, cfg, seed + asked, "self-instruct", False, deadline)
        asked += n
        before = len(kept)
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
        bar.update(min(len(kept), count) - before)
        bar.set_postfix(asked=asked, refresh=False)
    bar.close()
    return kept[:count]


def multi_turn_messages(target: Any, tokenizer: Any, firsts: list[str], settings: DataSettings, *, seed: int = 0,
                        progress: bool = True, deadline: float | None = None) -> list[list[dict[str, str]]]:
    """Two-turn exchanges as chat messages (``[{"role": "user", "content": ...}, ...]``): each
    request of ``firsts``, the target's answer to it (at most ``min(64, max_new_tokens)``
    tokens, sampled at ``settings.temperature``), and a follow-up. Exchanges whose first answer
    was not made by ``deadline``, or is empty, are left out."""
    gen = torch.Generator().manual_seed(seed)
    cfg = replace(_sized(settings, target), max_new_tokens=min(_ANSWER_TOKENS, settings.max_new_tokens))
    answers = _generate(target, tokenizer, [encode_prompt(tokenizer, f) for f in firsts], cfg, seed,
                        "multi-turn answers", progress, deadline)
    out = []
    for first, answer in zip(firsts, answers):
        if answer is None or not answer.strip():
            continue
        follow = FOLLOW_UPS[int(torch.randint(len(FOLLOW_UPS), (1,), generator=gen))]
        out.append([{"role": "user", "content": first}, {"role": "assistant", "content": answer.strip()},
                    {"role": "user", "content": follow}])
    return out


def conversation_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """The token ids of a conversation that ends with a user turn, the generation prompt of the
    next answer added: through the tokenizer's chat template when it has one, else the turns'
    texts joined by blank lines."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    return list(tokenizer("\n\n".join(m["content"] for m in messages) + "\n").input_ids)


def multi_turn(target: Any, tokenizer: Any, firsts: list[str], settings: DataSettings, *, seed: int = 0,
               progress: bool = True, deadline: float | None = None) -> list[list[int]]:
    """:func:`multi_turn_messages` as token ids (:func:`conversation_ids`): each request of
    ``firsts``, the target's answer to it, a follow-up, and the generation prompt of the
    target's second answer."""
    exchanges = multi_turn_messages(target, tokenizer, firsts, settings, seed=seed, progress=progress,
                                    deadline=deadline)
    return [conversation_ids(tokenizer, messages) for messages in exchanges]


def _cache_key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


_TARGET_SOURCES = ("self-instruct", "multi-turn")  # the sources the target writes


def _from_file(file: Any, tokenizer: Any, target_name: str, wanted: dict[str, int], seed: int
               ) -> list[str | list[int]]:
    """The mix's prompts with every source the prompt file holds drawn from it (in a seeded
    order, repeated when it holds fewer), the templates and the static sources it lacks made."""
    parts: list[str | list[int]] = default_prompts(target_name, wanted["templates"], seed) if wanted["templates"] else []
    for name in ("self-instruct", "multi-turn", "code", "prose", "long"):
        n = wanted[name.replace("-", "_")]
        if not n:
            continue
        held = file.prompts.get(name, [])
        if not held:
            if name in _TARGET_SOURCES:
                raise ValueError(f"prompts: {str(file.path)!r} holds no {name} prompts, which prompt_mix asks for "
                                 f"(it holds {', '.join(sorted(file.prompts)) or 'none'})")
            parts += static_source(name, n, seed)
            continue
        order = torch.randperm(len(held), generator=torch.Generator().manual_seed(seed)).tolist()
        picked = [order[i % len(held)] for i in range(n)]
        if name == "multi-turn":  # each distinct exchange through the chat template once
            ids = {j: conversation_ids(tokenizer, held[j]) for j in dict.fromkeys(picked)}
            parts += [list(ids[j]) for j in picked]
        else:
            parts += [held[j] for j in picked]
    return parts


def check_prompts_option(prompts: Any, data: Any, prompt_mix: Any) -> None:
    """``ValueError`` (or ``TypeError``) naming ``prompts`` unless ``prompts`` is None or a
    prompt file that a run can draw ``prompt_mix``'s sources from: no ``data`` alongside, a
    mix given, and every target source the mix asks for held by the file (its header read)."""
    if prompts is None:
        return
    if not isinstance(prompts, (str, Path)):
        raise TypeError(f"prompts: expected a prompt file path, got {type(prompts).__name__}")
    if data is not None:
        raise ValueError("prompts: a prompt file feeds the default prompts' mix; it is not used with data")
    if prompt_mix is None:
        raise ValueError("prompts: a prompt file is drawn from by prompt_mix's shares; give a prompt_mix too "
                         "(e.g. templates=0.5,self-instruct=0.25,multi-turn=0.25)")
    mix = PromptMix.parse(prompt_mix) if isinstance(prompt_mix, str) else prompt_mix
    counts = read_header(prompts)["counts"]
    for name in _TARGET_SOURCES:
        if getattr(mix, name.replace("-", "_"), 0) > 0 and not counts.get(name):
            raise ValueError(f"prompts: {str(prompts)!r} holds no {name} prompts, which prompt_mix asks for")


def mixed_prompts(target: Any, tokenizer: Any, target_name: str, count: int, mix: PromptMix | str,
                  settings: DataSettings, cache_root: str | Path, *, seed: int = 0, progress: bool = True,
                  deadline: float | None = None, prompts: str | Path | None = None) -> list[str | list[int]]:
    """``count`` prompts mixed from the sources of ``mix`` (a :class:`PromptMix` or its text),
    in a seeded order: text requests, and token ids for multi-turn exchanges.

    With a prompt file (``prompts``, made by :func:`make_prompt_file`; by default the one
    shipped for the target when the mix asks for the target's own sources,
    :func:`~specdecode.training.prompt_file.shipped_prompt_file`), every source it holds is
    drawn from it and the target is not asked for anything. Otherwise the target writes its
    sources here, stopping at ``deadline`` (``time.monotonic()``), templates make up what is
    missing, and the prompts are cached under ``cache_root``."""
    if isinstance(mix, str):
        mix = PromptMix.parse(mix)
    if not isinstance(mix, PromptMix):
        raise TypeError(f"prompt_mix: expected a PromptMix or its text, got {type(mix).__name__}")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"num_prompts: expected an int >= 1, got {count!r}")
    from specdecode.training.artifacts import target_fingerprint

    wanted = mix.counts(count)
    fingerprint = target_fingerprint(target)
    if prompts is None and (wanted["self_instruct"] or wanted["multi_turn"]):
        prompts = shipped_prompt_file(target_name, fingerprint)
    if prompts is not None:
        check_prompts_option(prompts, None, mix)
        file = read_prompt_file(prompts)
        if progress:
            held = ", ".join(f"{n} {name}" for name, n in file.header["counts"].items())
            tqdm.write(f"data: prompts drawn from {file.path} ({held}; made for {file.header['target']['name']})")
        parts = _from_file(file, tokenizer, target_name, wanted, seed)
        order = torch.randperm(len(parts), generator=torch.Generator().manual_seed(seed)).tolist()
        return [parts[i] for i in order]
    settings = _sized(settings, target)
    key = _cache_key(fingerprint, target_name, mix.text(), count, seed, settings.max_new_tokens,
                     settings.temperature, settings.batch_size)
    cache = Path(cache_root) / f"prompts-{key}.json"
    if cache.is_file():
        return json.loads(cache.read_text(encoding="utf-8"))["prompts"]
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
    prompts_out = [parts[i] for i in order]
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"mix": mix.text(), "made": made, "prompts": prompts_out}) + "\n", encoding="utf-8")
    return prompts_out


def file_mix(mix: PromptMix | str) -> PromptMix:
    """``mix`` (a :class:`PromptMix` or its text) as the sources of a prompt file, or
    ``ValueError`` / ``TypeError`` naming ``mix``: templates are not stored in a file."""
    if isinstance(mix, str):
        try:
            mix = PromptMix.parse(mix)
        except ValueError as exc:
            raise ValueError("mix:" + str(exc).partition(":")[2]) from None
    if not isinstance(mix, PromptMix):
        raise TypeError(f"mix: expected a PromptMix or its text, got {type(mix).__name__}")
    if mix.templates > 0:
        raise ValueError("mix: templates are made when a run starts and are not stored in a prompt file; name "
                         "only self-instruct, multi-turn, code, prose, long")
    return mix


def make_prompt_file(target: Any, tokenizer: Any, out: str | Path, *, target_name: str,
                     mix: PromptMix | str = "self-instruct=1,multi-turn=1", count: int = 2000,
                     settings: DataSettings | None = None, seed: int = 0, progress: bool = True,
                     deadline: float | None = None) -> Path:
    """Make the widened prompts once, ahead of a run, and write them into the prompt file
    ``out`` (:mod:`specdecode.training.prompt_file`); returns its path.

    ``count`` prompts are shared among ``mix``'s sources (templates are made when a run starts
    and are not stored: a mix that names them is refused): self-instruct requests, multi-turn
    exchanges (a request drawn from the templates and the self-instruct requests just written,
    the target's own first answer, a follow-up), and code, prose and long requests. The
    target's sources stop at ``deadline`` (``time.monotonic()``; the time is shared by their
    counts) and the file holds what they made by then. ``settings``: the batch size (default:
    sized for the target's device) and, for the first answers, ``temperature`` and
    ``max_new_tokens`` (at most 64)."""
    mix = file_mix(mix)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count: expected an int >= 1, got {count!r}")
    from specdecode.training.artifacts import target_fingerprint
    from specdecode.training.prompt_file import SUFFIX, held_out_record, write_prompt_file

    if not Path(out).name.endswith(SUFFIX) or Path(out).is_dir():
        raise ValueError(f"out: expected a file name ending with {SUFFIX}, got {str(out)!r}")
    start = time.monotonic()
    settings = _sized(settings or DataSettings(), target)
    wanted = mix.counts(count)
    templates = list(dict.fromkeys(default_prompts(target_name, 4096, seed + 1)))
    made: dict[str, list[Any]] = {}
    split = deadline
    if deadline is not None and wanted["self_instruct"] and wanted["multi_turn"]:
        split = start + max(0.0, deadline - start) * wanted["self_instruct"] / (wanted["self_instruct"] +
                                                                               wanted["multi_turn"])
    if wanted["self_instruct"]:
        made["self-instruct"] = self_instruct(target, tokenizer, wanted["self_instruct"], templates, settings,
                                              seed=seed, progress=progress, deadline=split)
    if wanted["multi_turn"]:
        firsts = list(dict.fromkeys(templates + made.get("self-instruct", [])))
        order = torch.randperm(len(firsts), generator=torch.Generator().manual_seed(seed + 3)).tolist()
        firsts = [firsts[order[i % len(order)]] for i in range(wanted["multi_turn"])]
        made["multi-turn"] = multi_turn_messages(target, tokenizer, firsts, settings, seed=seed, progress=progress,
                                                 deadline=deadline)
    for name in ("code", "prose", "long"):
        if wanted[name]:
            made[name] = static_source(name, wanted[name], seed)
    header = {"target": {"name": target_name, "weights_hash": target_fingerprint(target)}, "mix": mix.text(),
              "seed": seed, "asked": {name.replace("_", "-"): n for name, n in wanted.items() if n},
              "settings": {"batch_size": settings.batch_size,
                           "self_instruct": {"max_new_tokens": _REQUEST_TOKENS, "temperature": 1.0},
                           "multi_turn_first_answer": {"max_new_tokens": min(_ANSWER_TOKENS, settings.max_new_tokens),
                                                       "temperature": settings.temperature}},
              "held_out": held_out_record(), "seconds": round(time.monotonic() - start, 1),
              "made": time.strftime("%Y-%m-%d", time.gmtime())}
    return write_prompt_file(out, header, made)
