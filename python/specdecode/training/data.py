"""Training data for drafters: the target's own generations (self-distillation), or user text,
labelled with the target's token distributions, cached on disk.

Sources (:func:`token_sequences`):

* prompts (the default): each prompt is continued by the target itself (left-padded batches on
  specdecode's static decode path, :mod:`specdecode.training.continuations`; sampled from the
  target's own law at temperature 0.7 with a seed per batch: between greedy and sampled
  decoding), and the prompt plus its continuation becomes one example; the loss and the
  acceptance estimates count the continuation only. Default prompts: for the ``demo`` target, def/class windows
  of the demo corpus' *train* split (never the held-out files that ``demo_prompts()`` and the
  benchmarks use); for any other target, :data:`GENERAL_PROMPTS`, a list written for this kit,
  and the templated requests of :mod:`specdecode.training.prompts` (about 1,900 distinct
  prompts in all), wrapped in the tokenizer's chat template when it has one.
* a file: ``.jsonl`` lines (``{"prompt": "..."}`` or a JSON string) are prompts as above; any
  other file is plain text, cut into windows of ``max_length`` tokens and used as it is.

Every example is stored with the target's top-``k`` log-probabilities at each position (all of
them when the vocabulary has at most ``k`` ids) and its hidden states at ``feature_layers``, so
training never runs the target again. Continuations made on the static decode path keep what
their own decode steps computed (:func:`~specdecode.training.continuations.continue_and_label`:
the prompt and every new token but the last, labelled from the last prompt position on, zeros
before); text, and continuations from Hugging Face's ``generate``, are run through the target
once more (the labelling forward). Examples are computed in batches and each batch is saved
as it is finished under ``OUT/data/<target hash>-<data hash>/``: an interrupted run, or a second
run with the same target and data, reuses them. The progress bar shows the target's generated
tokens per second, and :class:`DataStats` keeps them for the run's record.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor
from tqdm.auto import tqdm

from specdecode.training.continuations import continue_and_label, continue_prompts, data_decode_path

__all__ = ["GENERAL_PROMPTS", "LABEL_SOURCES", "Example", "DataSettings", "DataStats", "continue_prompts", "data_key",
           "default_prompts", "distill_examples", "encode_prompt", "is_text_data", "label_sequences",
           "token_sequences"]

#: Default prompts for targets other than ``demo``: everyday chat and instruction requests,
#: written for this kit (no data set is downloaded).
GENERAL_PROMPTS: tuple[str, ...] = (
    "Explain what a hash table is and when to use one.",
    "Write a short poem about the sea at night.",
    "Give me three tips for sleeping better.",
    "What is the difference between weather and climate?",
    "Summarize the plot of a heist movie you invent, in five sentences.",
    "How do I make a simple tomato sauce?",
    "Write a Python function that reverses the words of a sentence.",
    "What causes the seasons on Earth?",
    "Draft a polite email asking a colleague to review my report.",
    "List five ideas for a rainy afternoon with children.",
    "Why is the sky blue?",
    "Explain recursion to a ten-year-old.",
    "What are the pros and cons of working from home?",
    "Translate 'good morning, how are you?' into French and Spanish.",
    "Write a haiku about autumn leaves.",
    "How does a bicycle stay upright?",
    "Give a step-by-step plan to learn to play the guitar.",
    "What is photosynthesis?",
    "Write a short story that begins with a knock on the door.",
    "Compare cats and dogs as pets.",
    "How do vaccines train the immune system?",
    "Suggest a name for a small bakery and explain why.",
    "Explain the rules of chess in simple terms.",
    "What should I pack for a weekend hiking trip?",
    "Write a SQL query that counts orders per customer.",
    "Describe the water cycle.",
    "What is inflation and why does it matter?",
    "Give me a motivational message for a Monday morning.",
    "How do I convert Celsius to Fahrenheit?",
    "Write a limerick about a forgetful robot.",
    "What are black holes?",
    "Explain what an API is with an everyday analogy.",
    "How can I improve my public speaking?",
    "Write a thank-you note to a teacher.",
    "What is the capital of Australia, and why is it not Sydney?",
    "Describe a healthy breakfast.",
    "Explain the difference between a list and a tuple in Python.",
    "What happened during the Industrial Revolution?",
    "Give three arguments for learning a second language.",
    "Write a dialogue between a cat and a mouse who become friends.",
    "How does the internet deliver a web page to my browser?",
    "What are some good habits for saving money?",
    "Explain gravity in two sentences.",
    "Write a JavaScript function that checks whether a number is prime.",
    "What is the meaning of the word 'serendipity'? Use it in a sentence.",
    "Plan a three-day trip to Rome.",
    "How do bees make honey?",
    "Tell me a fun fact about octopuses.",
)


_CACHE_FORMAT = 3  # part of the data key: a cache written by another format is not read


#: Where :class:`DataSettings` ``labels`` may come from.
LABEL_SOURCES = ("decode", "forward")


@dataclass(frozen=True)
class DataSettings:
    """How examples are made. ``max_length``: tokens per example (prompt plus continuation, or a
    text window); ``max_new_tokens``: the target's continuation of each prompt; ``top_k``:
    target log-probabilities kept per position; ``batch_size``: prompts per generate call (None:
    sized for the target's device when a run starts, :func:`specdecode.training.device.data_batch_size`);
    ``temperature``: of the target's continuations (0: greedy); ``feature_layers``: indices
    into the target's ``hidden_states`` also kept per position (feature drafters), or None;
    ``labels``: where continuations on the static path get their labels, ``"decode"`` (their own
    decode steps, :func:`~specdecode.training.continuations.continue_and_label`) or
    ``"forward"`` (a second forward over the finished sequences, as text always is)."""

    max_length: int = 192
    max_new_tokens: int = 96
    top_k: int = 64
    batch_size: int | None = None
    temperature: float = 0.7
    seed: int = 0
    feature_layers: tuple[int, ...] | None = None
    labels: str = "decode"

    def __post_init__(self) -> None:
        if self.labels not in LABEL_SOURCES:
            raise ValueError(f"labels: expected one of {LABEL_SOURCES}, got {self.labels!r}")


@dataclass
class DataStats:
    """What :func:`distill_examples` computed (batches read from the cache are not counted):
    ``batches``; ``generated_tokens``, the target's continuations (up to and including EOS), in
    ``generate_seconds``; ``labelled_tokens``, every token of the examples made; ``seconds``, the
    whole work of those batches (generation, labelling, saving); ``decode_path``, the path of the
    continuations (:func:`~specdecode.training.continuations.data_decode_path`), None for text
    or when every batch came from the cache."""

    batches: int = 0
    generated_tokens: int = 0
    generate_seconds: float = 0.0
    labelled_tokens: int = 0
    seconds: float = 0.0
    decode_path: str | None = None

    @property
    def generated_per_second(self) -> float:
        """The target's generated tokens per second of generation (0 before any)."""
        return self.generated_tokens / self.generate_seconds if self.generate_seconds > 0 else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Data tokens made per second of the whole work: the generated tokens when prompts are
        continued, else the labelled tokens (0 before any)."""
        made = self.generated_tokens if self.decode_path is not None else self.labelled_tokens
        return made / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        """One line: what was made, in how long, at what rate."""
        if self.decode_path is None:
            return (f"data: {self.labelled_tokens:,} tokens labelled in {self.seconds:.1f} s "
                    f"({self.tokens_per_second:,.0f} tokens/s)")
        return (f"data: {self.generated_tokens:,} target tokens generated ({self.decode_path} path) in "
                f"{self.generate_seconds:.1f} s, {self.generated_per_second:,.0f} tokens/s; with labelling "
                f"{self.tokens_per_second:,.0f} tokens/s")


@dataclass
class Example:
    """One training example.

    Shape:
        input_ids: ``[t]`` int64, the tokens.
        top_logp: ``[t, k]`` float16, the target's largest log-probabilities of the next token
            at each position, in decreasing order (zeros before ``start`` when the decode steps
            labelled the example).
        top_ids: ``[t, k]`` int32, the token ids of ``top_logp``.
        features: ``[t, F]`` float16 or None, the target's hidden states at the data's
            ``feature_layers`` (concatenated), from the same forwards as the labels.

    ``start``: the first position that counts (in the loss and the acceptance estimates): the
    last prompt position for a continued prompt (so only the target's own continuation is
    learned and scored, not a chat template repeated in every example), 0 for text. Nothing
    may read the labels before it.
    """

    input_ids: Tensor
    top_logp: Tensor
    top_ids: Tensor
    start: int = 0
    features: Tensor | None = None


@lru_cache(maxsize=1)
def _demo_train_prompts() -> tuple[str, ...]:
    """Two def/class windows per file of the demo corpus' train split (read once per process)."""
    from specdecode.demo.corpus import extract_prompts, iter_stdlib_sources

    return tuple(p for _, text, split in iter_stdlib_sources() if split == "train"
                 for p in extract_prompts(text, per_file=2))


def default_prompts(target_name: str, count: int, seed: int = 0) -> list[str]:
    """``count`` default prompts for a target (see the module docstring), in a seeded order; the
    list is repeated when it is shorter (each repeat gets its own sampled continuation)."""
    if target_name == "demo":
        texts = list(_demo_train_prompts())
    else:
        from specdecode.training.prompts import chat_prompts, num_chat_prompts

        texts = list(dict.fromkeys(list(GENERAL_PROMPTS) + chat_prompts(num_chat_prompts())))
    order = torch.randperm(len(texts), generator=torch.Generator().manual_seed(seed)).tolist()
    return [texts[order[i % len(order)]] for i in range(count)]


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """The token ids of a user request: through the tokenizer's chat template when it has one
    (a generation prompt added), else the text's own tokens."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    return list(tokenizer(text).input_ids)


def token_sequences(data: Any, tokenizer: Any, max_length: int) -> tuple[list[list[int]], bool]:
    """``(sequences, continue_them)``: token-id prompts to be continued by the target, or text
    windows used as they are (``continue_them`` False), from ``data``: a file path (see the
    module docstring), or a sequence of prompt strings or token-id lists / 1-D tensors."""
    if isinstance(data, (str, Path)):
        path = Path(data)
        if not path.is_file():
            raise ValueError(f"data: no such file {str(path)!r}")
        if tokenizer is None:
            raise ValueError("tokenizer: needed to read the data file (pass the target's tokenizer)")
        text = path.read_text(encoding="utf-8")
        if not is_text_data(path):
            prompts = [json.loads(line) for line in text.splitlines() if line.strip()]
            prompts = [p["prompt"] if isinstance(p, dict) else p for p in prompts]
            return token_sequences(prompts, tokenizer, max_length)
        ids = list(tokenizer(text).input_ids)
        windows = [ids[i: i + max_length] for i in range(0, len(ids), max_length)]
        windows = [w for w in windows if len(w) >= 2]
        if not windows:
            raise ValueError(f"data: {str(path)!r} holds fewer than 2 tokens of text")
        return windows, False
    if not isinstance(data, Sequence) or len(data) == 0:
        raise ValueError(f"data: expected a file path or a non-empty sequence of prompts, got {type(data).__name__}")
    out = []
    encoded: dict[str, list[int]] = {}  # a mix repeats its prompts: each distinct text is encoded once
    for i, item in enumerate(data):
        if isinstance(item, str):
            if tokenizer is None:
                raise ValueError("tokenizer: text prompts need the target's tokenizer")
            if item not in encoded:
                encoded[item] = encode_prompt(tokenizer, item)
            ids = list(encoded[item])
        elif isinstance(item, Tensor) and item.dim() == 1:
            ids = item.tolist()
        elif isinstance(item, (list, tuple)) and all(isinstance(t, int) for t in item):
            ids = list(item)
        else:
            raise TypeError(f"data[{i}]: expected a string, a list of token ids or a 1-D tensor, "
                            f"got {type(item).__name__}")
        if not ids:
            raise ValueError(f"data[{i}]: empty prompt")
        out.append(ids)
    return out, True


def is_text_data(data: Any) -> bool:
    """Whether ``data`` (as :func:`token_sequences` takes it) is plain text, used as it is and
    labelled by a forward, rather than prompts the target continues: a path not ending in
    ``.jsonl``.

    >>> is_text_data("corpus.txt"), is_text_data("prompts.jsonl"), is_text_data(["Hello"])
    (True, False, False)
    """
    return isinstance(data, (str, Path)) and Path(data).suffix != ".jsonl"


def data_key(sequences: list[list[int]], continue_them: bool, settings: DataSettings) -> str:
    """A short hash naming the data: the sequences, whether the target continues them, and the settings."""
    fields = {k: v for k, v in settings.__dict__.items() if not (k == "feature_layers" and v is None)}
    record = json.dumps([_CACHE_FORMAT, sequences, continue_them, fields], sort_keys=True)
    return hashlib.sha256(record.encode()).hexdigest()[:16]


#: The labelling forward runs over a batch's sequences in this many groups of similar length
#: (sorted by length, equal row counts): less right padding and a quarter of the logits in memory
#: at a time. SmolLM2 on the CPU, 32 continued prompts: 10.8 s in one forward, 8.8 s in 2 groups,
#: 8.7 s in 4 (the same labels up to float16 rounding).
LABEL_GROUPS = 4


def label_sequences(target: Any, sequences: list[list[int]], starts: list[int], top_k: int,
                    feature_layers: tuple[int, ...] | None = None) -> list[Example]:
    """The target's top-k log-probs (and its hidden states at ``feature_layers``) at every
    position of ``sequences``, labelled in :data:`LABEL_GROUPS` groups of similar length; the
    examples in the order of ``sequences``."""
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    groups = min(LABEL_GROUPS, len(order))
    examples: list[Example | None] = [None] * len(sequences)
    for g in range(groups):
        rows = order[g * len(order) // groups: (g + 1) * len(order) // groups]
        labelled = _label_forward(target, [sequences[i] for i in rows], [starts[i] for i in rows], top_k,
                                  feature_layers)
        for i, example in zip(rows, labelled):
            examples[i] = example
    return examples  # type: ignore[return-value]


@torch.no_grad()
def _label_forward(target: Any, sequences: list[list[int]], starts: list[int], top_k: int,
                   feature_layers: tuple[int, ...] | None = None) -> list[Example]:
    """Run the target once over right-padded ``sequences`` and keep its top-k log-probs (and
    its hidden states at ``feature_layers``)."""
    device = next(target.parameters()).device
    width = max(len(s) for s in sequences)
    ids = torch.zeros((len(sequences), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = torch.tensor(seq)
        mask[row, : len(seq)] = 1
    out = target(input_ids=ids.to(device), attention_mask=mask.to(device),
                 output_hidden_states=feature_layers is not None)
    logits = out.logits.float()
    features = None
    if feature_layers is not None:
        features = torch.cat([out.hidden_states[i] for i in feature_layers], -1).to("cpu", torch.float16)
    k = min(top_k, logits.shape[-1])
    top_logp, top_ids = torch.log_softmax(logits, -1).topk(k, dim=-1)
    return [Example(ids[row, : len(seq)].clone(), top_logp[row, : len(seq)].to("cpu", torch.float16),
                    top_ids[row, : len(seq)].to("cpu", torch.int32), starts[row],
                    None if features is None else features[row, : len(seq)].clone())
            for row, seq in enumerate(sequences)]


def distill_examples(target: Any, sequences: list[list[int]], continue_them: bool, settings: DataSettings,
                     cache_root: Path, target_hash: str, *, deadline: float | None = None,
                     num_batches: int | None = None, progress: bool = True,
                     stats: DataStats | None = None) -> tuple[list[Example], int]:
    """``(examples, batches)``: the labelled examples, batch by batch from the cache or computed
    and cached. Stops at ``num_batches`` batches when given (a resumed run asks for exactly what
    it trained on), else when every sequence is done or at ``deadline`` (``time.monotonic()``;
    at least one batch is always made). ``stats``, when given, is filled in with what was
    computed (:class:`DataStats`); the progress bar shows the same rates as it runs, and a
    summary line is written at the end when ``progress``.

    On the graphed (CUDA) path every batch is padded to one width (the longest prompt of the
    stage) and one row count (``batch_size``), so that all of them replay one static layout,
    which is freed at the end of the stage."""
    if settings.batch_size is None:
        raise ValueError("data_settings: batch_size is None; size it for the device first")
    if stats is not None and not isinstance(stats, DataStats):
        raise TypeError(f"stats: expected a DataStats or None, got {type(stats).__name__}")
    stats = stats if stats is not None else DataStats()
    folder = Path(cache_root) / f"{target_hash.split(':')[-1][:16]}-{data_key(sequences, continue_them, settings)}"
    folder.mkdir(parents=True, exist_ok=True)
    total = -(-len(sequences) // settings.batch_size)
    wanted = total if num_batches is None else min(num_batches, total)
    keep = max(1, settings.max_length - settings.max_new_tokens)  # prompt tokens kept before a continuation
    examples: list[Example] = []
    done = 0
    bar = tqdm(total=wanted, desc="data: target generations" if continue_them else "data: target labels",
               unit="batch", disable=not progress, leave=False)
    path = None
    for index in range(wanted):
        if num_batches is None and index > 0 and deadline is not None and time.monotonic() > deadline:
            break
        file = folder / f"batch_{index:05d}.pt"
        if file.is_file():
            batch = [Example(**row) for row in torch.load(file)]
        else:
            start = time.perf_counter()
            chunk = [s[-settings.max_length:] for s in
                     sequences[index * settings.batch_size: (index + 1) * settings.batch_size]]
            starts = [0] * len(chunk)
            batch = None
            if continue_them:
                if path is None:
                    path = stats.decode_path = data_decode_path(target, settings)
                prompts = [s[-keep:] for s in chunk]
                shape = (dict(width=min(keep, max(len(s) for s in sequences)), rows=settings.batch_size)
                         if path == "graphed" else {})
                seed = settings.seed * 100_003 + index
                # labelled by the decode steps themselves (no second forward), or None: HF generate
                rows = None
                if path != "hf_generate" and settings.labels == "decode":
                    rows = continue_and_label(target, prompts, settings, seed, decode_path=path, **shape)
                if rows is None:  # the labelling forward below labels them
                    decode = path if settings.labels == "forward" else "hf_generate"
                    chunk = continue_prompts(target, prompts, settings, seed, decode_path=decode,
                                             **(shape if decode == path else {}))
                    generated = sum(len(c) - len(p) for c, p in zip(chunk, prompts))
                else:
                    batch = [Example(**row) for row in rows]
                    chunk = [e.input_ids.tolist() for e in batch]
                    generated = sum(len(c) - len(p) + 1 for c, p in zip(chunk, prompts))  # + the last new token
                stats.generate_seconds += time.perf_counter() - start
                stats.generated_tokens += generated
                starts = [len(p) - 1 for p in prompts]  # the prompt's last position predicts the first new token
            if batch is None:
                batch = label_sequences(target, chunk, starts, settings.top_k, settings.feature_layers)
            torch.save([row.__dict__ for row in batch], file.with_suffix(".tmp"))
            file.with_suffix(".tmp").replace(file)
            stats.batches += 1
            stats.labelled_tokens += sum(len(c) for c in chunk)
            stats.seconds += time.perf_counter() - start
            bar.set_postfix_str(_rates(stats), refresh=False)
        examples.extend(batch)
        done += 1
        bar.update(1)
    bar.close()
    if path in ("static", "graphed"):
        from specdecode.engine.static_layouts import clear_static_sessions

        clear_static_sessions(target)  # the stage's caches (and graphs) go back to the device
    if progress and stats.batches:
        tqdm.write(stats.summary(), file=sys.stderr)
    return examples, done


def _rates(stats: DataStats) -> str:
    if stats.decode_path is None:
        return f"{stats.tokens_per_second:,.0f} tok/s"
    return f"{stats.generated_per_second:,.0f} gen tok/s, {stats.tokens_per_second:,.0f} tok/s"
