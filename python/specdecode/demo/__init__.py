"""The embedded demo pair: a tiny, honestly trained (target, draft) pair of causal LMs.

Both models are standard ``transformers.LlamaForCausalLM`` checkpoints trained from
scratch on the Python standard library's sources by ``scripts/train_pair.py``; they
share one byte-level BPE tokenizer.  Model cards with the full recipe, validation
losses and measured acceptance rates live in ``weights/target/README.md`` and
``weights/draft/README.md``; the numbers are also in ``weights/pair_stats.json``.

* :func:`load_demo_pair` -- the trained (target, draft, tokenizer), loaded with
  ``from_pretrained`` exactly as a user would.
* :func:`demo_prompts` -- held-out prompts (from stdlib files never trained on).
* :func:`enlarge_model` / :func:`load_benchmark_pair` -- a *function-preserving*
  enlargement of the trained target whose per-token cost is realistic relative to
  the draft (see :func:`enlarge_model`); ``load_benchmark_pair(size="1b")`` widens it
  into a 1.03B-parameter model with a real 1B model's shapes, for GPUs
  (:mod:`specdecode.demo.widen`).
* :func:`decode_step_seconds` -- time one KV-cached single-token decode step.

Nothing here imports the compiled ``specdecode._C`` extension.
"""

from __future__ import annotations

import copy
import json
import time
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from specdecode.models.cache_io import cache_kwargs, returned_cache

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "DEMO_DIR",
    "WEIGHTS_DIR",
    "PROMPTS_FILE",
    "BENCHMARK_EXTRA_LAYERS",
    "BENCHMARK_INTERMEDIATE_SIZE",
    "load_demo_pair",
    "demo_prompts",
    "pair_stats",
    "enlarge_model",
    "load_benchmark_pair",
    "decode_step_seconds",
    "BENCHMARK_SIZES",
]

DEMO_DIR: Path = Path(__file__).resolve().parent
WEIGHTS_DIR: Path = DEMO_DIR / "weights"
PROMPTS_FILE: Path = DEMO_DIR / "prompts.json"

#: Default enlargement used by :func:`load_benchmark_pair` (chosen so that one decode
#: step of the enlarged target costs >= 20x one decode step of the draft on a 2-core CPU).
BENCHMARK_EXTRA_LAYERS: int = 10
BENCHMARK_INTERMEDIATE_SIZE: int = 4096
#: ``load_benchmark_pair(size=...)``: "small" (the CPU pair, :func:`enlarge_model`) or "1b"
#: (:data:`specdecode.demo.widen.BENCHMARK_1B`, :func:`specdecode.demo.widen.widen_model`).
BENCHMARK_SIZES: tuple[str, ...] = ("small", "1b")


def load_demo_pair(
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    weights_dir: str | Path | None = None,
) -> tuple["PreTrainedModel", "PreTrainedModel", "PreTrainedTokenizerBase"]:
    """Load the trained demo ``(target, draft, tokenizer)``.

    Uses ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained`` on
    the local directories ``weights/target`` and ``weights/draft`` (no network access).
    The weights are stored in float16 and converted to ``dtype`` on load.  Both models
    are returned in eval mode on ``device``; they share the tokenizer (and vocabulary).

    Args:
        device: where to put the models.
        dtype: parameter dtype of the returned models (float32 by default).
        weights_dir: alternative directory holding ``target/`` and ``draft/``.

    Example:
        >>> from specdecode.demo import load_demo_pair
        >>> target, draft, tok = load_demo_pair()
        >>> ids = tok("def add(a, b):\\n", return_tensors="pt").input_ids
        >>> out = target.generate(ids, max_new_tokens=8, do_sample=False)
        >>> isinstance(tok.decode(out[0]), str)
        True
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdecode.models.loading import quiet_loading

    root = WEIGHTS_DIR if weights_dir is None else Path(weights_dir)
    models = []
    for name in ("target", "draft"):
        path = root / name
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"demo weights not found in {path}; run scripts/train_pair.py")
        with quiet_loading():
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        models.append(model.to(device).eval())
    tokenizer = AutoTokenizer.from_pretrained(root / "target")
    return models[0], models[1], tokenizer


@lru_cache(maxsize=1)
def _prompt_records() -> tuple[dict[str, str], ...]:
    data = json.loads(PROMPTS_FILE.read_text(encoding="utf-8"))
    return tuple(data["prompts"])


def demo_prompts(n: int | None = None) -> list[str]:
    """Return held-out prompt strings (the first ``n``, or all when ``n`` is None).

    The prompts are windows (<= 400 characters, ending at a line break) that start at
    ``def``/``class`` lines of standard-library files that were held out from training
    and validation.  They were extracted once at training time and are stored in
    ``prompts.json``, so they do not depend on the running Python version.

    Example:
        >>> from specdecode.demo import demo_prompts
        >>> len(demo_prompts(4))
        4
    """
    texts = [rec["text"] for rec in _prompt_records()]
    return texts if n is None else texts[:n]


def pair_stats() -> dict[str, Any]:
    """The machine-readable training/evaluation record of the pair (``weights/pair_stats.json``)."""
    return json.loads((WEIGHTS_DIR / "pair_stats.json").read_text(encoding="utf-8"))


def _decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or len(layers) == 0:
        raise TypeError("enlarge_model expects a Llama-style *ForCausalLM (model.model.layers)")
    layer = layers[0]
    for attr in ("self_attn", "mlp"):
        if not hasattr(layer, attr):
            raise TypeError(f"decoder layer has no '{attr}'")
    for proj in ("gate_proj", "up_proj", "down_proj"):
        if not hasattr(layer.mlp, proj):
            raise TypeError(f"MLP has no '{proj}' (expected a gated Llama-style MLP)")
    if not hasattr(layer.self_attn, "o_proj"):
        raise TypeError("attention has no 'o_proj'")
    return layers


def enlarge_model(
    model: "PreTrainedModel",
    extra_layers: int = BENCHMARK_EXTRA_LAYERS,
    intermediate_size: int | None = BENCHMARK_INTERMEDIATE_SIZE,
    seed: int = 0,
) -> "PreTrainedModel":
    """Build a bigger, slower model that computes *exactly the same function* as ``model``.

    Tiny models on a CPU are dominated by per-call overhead, so the trained demo target
    costs only a few times its draft per token, unlike real pairs (20-100x).  This builds
    a copy of a Llama-style causal LM (``model.model.layers[i].self_attn.o_proj``,
    ``.mlp.{gate,up,down}_proj``) with real extra compute that cannot change its output:

    1. **Wider MLPs.**  Every original layer's MLP goes from ``I0`` to
       ``intermediate_size`` units.  Units ``[0, I0)`` keep the trained weights; the new
       units get random ``gate_proj``/``up_proj`` rows, but their ``down_proj`` columns
       are exactly zero, so they add ``0`` to the MLP output.
    2. **Extra decoder layers.**  ``extra_layers`` new layers are interleaved between the
       trained ones (trained layer ``i`` goes to position ``round(i * L_new / L_old)``).
       Each has random q/k/v, gate/up weights and norms of ones, but **zero**
       ``o_proj`` and ``down_proj`` weights (and biases, if any): both residual branches
       add exactly ``0``, so the layer is an exact pass-through that still performs the
       full attention + MLP compute and grows the KV cache like a real layer.

    Hidden size, heads, vocabulary, embeddings, final norm and LM head are unchanged.
    In exact arithmetic the logits are identical; in floating point they agree up to
    summation-order rounding (``torch.allclose(..., atol=1e-4)`` on float32 logits).

    Args:
        model: a trained Llama-style ``*ForCausalLM`` (left untouched).
        extra_layers: number of pass-through layers to insert (>= 0).
        intermediate_size: new MLP width (>= the model's); ``None`` keeps it.
        seed: seed for the random (non-contributing) weights; the result is deterministic.

    Returns:
        A new model of the same class, same dtype/device, in eval mode; its config has the
        new ``num_hidden_layers``/``intermediate_size`` and an ``enlarged_from`` record.

    Example:
        >>> import torch
        >>> from specdecode.demo import load_demo_pair, enlarge_model
        >>> target, draft, tok = load_demo_pair()
        >>> big = enlarge_model(target, extra_layers=2, intermediate_size=1024)
        >>> ids = tok("import os\\n", return_tensors="pt").input_ids
        >>> with torch.no_grad():
        ...     torch.allclose(big(ids).logits, target(ids).logits, atol=1e-4)
        True
    """
    layers = _decoder_layers(model)
    cfg = model.config
    old_layers = len(layers)
    old_inter = int(cfg.intermediate_size)
    new_inter = old_inter if intermediate_size is None else int(intermediate_size)
    if extra_layers < 0:
        raise ValueError("extra_layers must be >= 0")
    if new_inter < old_inter:
        raise ValueError(f"intermediate_size {new_inter} < original {old_inter}")
    new_layers = old_layers + extra_layers

    new_cfg = copy.deepcopy(cfg)
    new_cfg.num_hidden_layers = new_layers
    new_cfg.intermediate_size = new_inter
    if getattr(new_cfg, "layer_types", None) is not None:
        if len(set(new_cfg.layer_types)) > 1:
            raise TypeError("models with mixed layer_types are not supported")
        new_cfg.layer_types = [new_cfg.layer_types[0]] * new_layers
    new_cfg.enlarged_from = {
        "num_hidden_layers": old_layers,
        "intermediate_size": old_inter,
        "extra_layers": extra_layers,
        "seed": seed,
    }

    # Trained layer i -> position pos[i] (strictly increasing, first at 0).
    pos = [round(i * new_layers / old_layers) for i in range(old_layers)]
    pos_of = dict(enumerate(pos))
    kept = set(pos)

    param = next(model.parameters())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        big = type(model)(new_cfg)
    big.to(device=param.device, dtype=param.dtype)

    old_sd = model.state_dict()
    new_sd = big.state_dict()
    with torch.no_grad():
        for key, value in old_sd.items():
            new_key = key
            parts = key.split(".")
            if len(parts) > 3 and parts[0] == "model" and parts[1] == "layers":
                parts[2] = str(pos_of[int(parts[2])])
                new_key = ".".join(parts)
            target = new_sd[new_key]
            if target.shape == value.shape:
                target.copy_(value)
            elif key.endswith(("mlp.gate_proj.weight", "mlp.up_proj.weight",
                               "mlp.gate_proj.bias", "mlp.up_proj.bias")):
                target[:old_inter].copy_(value)  # new rows stay random
            elif key.endswith("mlp.down_proj.weight"):
                target.zero_()
                target[:, :old_inter].copy_(value)  # new columns are exactly zero
            else:
                raise RuntimeError(f"unexpected shape change for {key}: {tuple(value.shape)}")
        for idx, layer in enumerate(_decoder_layers(big)):
            if idx in kept:
                continue
            for lin in (layer.self_attn.o_proj, layer.mlp.down_proj):
                lin.weight.zero_()
                if getattr(lin, "bias", None) is not None:
                    lin.bias.zero_()
    if getattr(cfg, "tie_word_embeddings", False):
        big.tie_weights()
    return big.eval()


def load_benchmark_pair(
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    extra_layers: int = BENCHMARK_EXTRA_LAYERS,
    intermediate_size: int | None = BENCHMARK_INTERMEDIATE_SIZE,
    seed: int = 0,
    size: str = "small",
) -> tuple["PreTrainedModel", "PreTrainedModel", "PreTrainedTokenizerBase"]:
    """Load a cost-realistic ``(target, draft, tokenizer)`` for benchmarks.

    ``size="small"`` (default): the target is :func:`enlarge_model` applied to the trained
    demo target: its outputs (and therefore the acceptance rate of the pair) are those of the
    trained target, but a single-token KV-cached decode step costs >= 20x the draft's on a
    2-core CPU with the defaults (see ``decode_step_seconds``).  Built offline in a few
    seconds; nothing is downloaded.

    ``size="1b"``: the trained target widened (function-preserving,
    :func:`specdecode.demo.widen.widen_model`) to the shapes of Llama-3.2-1B with the demo
    vocabulary, 1.03B parameters (:data:`specdecode.demo.widen.BENCHMARK_1B`), built directly
    on ``device`` in ``dtype`` (``extra_layers`` / ``intermediate_size`` do not apply): one
    decode step reads ~2 GB of bf16 weights, memory-bound like a real 1B model. Meant for a GPU
    (``load_benchmark_pair("cuda", torch.bfloat16, size="1b")``); on a CPU it needs ~4 GB in
    float32. The draft is the trained demo draft in both cases.

    Example:
        >>> from specdecode.demo import load_benchmark_pair
        >>> big_target, draft, tok = load_benchmark_pair()
        >>> big_target.config.num_hidden_layers
        16
    """
    if size not in BENCHMARK_SIZES:
        raise ValueError(f"size: expected one of {', '.join(repr(s) for s in BENCHMARK_SIZES)}, got {size!r}")
    if size == "1b":
        from specdecode.demo.widen import BENCHMARK_1B, widen_model

        target, draft, tokenizer = load_demo_pair(device="cpu", dtype=torch.float32)
        big = widen_model(target, **BENCHMARK_1B, seed=seed, device=device, dtype=dtype)
        return big, draft.to(device=device, dtype=dtype), tokenizer
    target, draft, tokenizer = load_demo_pair(device=device, dtype=dtype)
    big = enlarge_model(target, extra_layers=extra_layers, intermediate_size=intermediate_size, seed=seed)
    del target
    return big, draft, tokenizer


@torch.inference_mode()
def decode_step_seconds(
    model: torch.nn.Module,
    context_len: int = 128,
    steps: int = 32,
    warmup: int = 4,
    repeats: int = 3,
) -> float:
    """Median wall time (seconds) of one single-token decode step with a KV cache.

    Prefills ``context_len`` tokens, then times ``steps`` calls
    ``model(input_ids=<1 token>)`` with a KV cache (after ``warmup`` untimed ones)
    and returns the median per-step time over ``repeats`` such runs.
    """
    device = next(model.parameters()).device
    vocab = int(model.config.vocab_size)
    gen = torch.Generator().manual_seed(0)
    results = []
    for _ in range(repeats):
        ids = torch.randint(0, vocab, (1, context_len), generator=gen).to(device)
        out = model(input_ids=ids, use_cache=True)
        past = returned_cache(out)
        tok = out.logits[:, -1:].argmax(-1)
        for _ in range(warmup):
            out = model(input_ids=tok, **cache_kwargs(model, past))
            past = returned_cache(out)
        t0 = time.perf_counter()
        for _ in range(steps):
            out = model(input_ids=tok, **cache_kwargs(model, past))
            past = returned_cache(out)
            tok = out.logits[:, -1:].argmax(-1)
        results.append((time.perf_counter() - t0) / steps)
    results.sort()
    return results[len(results) // 2]
