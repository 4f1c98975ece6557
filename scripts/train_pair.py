#!/usr/bin/env python
"""Train the embedded demo (target, draft) pair shipped in ``specdecode/demo/weights``.

Reproducible recipe (fixed seed; every number below is an argparse default):

* **Corpus**: the ``.py`` sources of this interpreter's standard library, minus test
  suites, ``site-packages``, ``encodings`` and ``pydoc_data`` (see
  ``specdecode.demo.corpus``).  Files are split train/val/held-out (90/5/5) by a
  SHA-256 hash of their stdlib-relative path.  Held-out files are only used to cut
  benchmark prompts, stored as ``demo/prompts.json``.
* **Tokenizer**: byte-level BPE (``tokenizers``), vocab 4096, trained on the train
  split; single special token ``<|endoftext|>`` (id 0) used as bos/eos/pad.  Wrapped as
  ``PreTrainedTokenizerFast`` and saved next to each model.
* **Target**: ``LlamaForCausalLM``, hidden 256, 6 layers, 4 heads, MLP 688, tied
  embeddings (~5.8M params); next-token loss on random 256-token windows of the
  train stream (files joined with ``<|endoftext|>``), 600 steps x 16 windows (~1 epoch),
  AdamW + warmup + cosine, bf16 autocast with fp32 master weights.
* **Draft**: ``LlamaForCausalLM``, hidden 96, 2 layers, 3 heads, MLP 256, tied
  embeddings (~0.6M params, ~9.4x fewer); 400 steps, distilled from the *saved*
  (fp16-rounded) target: ``loss = w * KL(p_target || q_draft) + (1 - w) * CE(labels)``, ``w = 0.9``.
  Forward KL on the full softmax pushes ``q`` towards ``p`` everywhere, which is what
  the acceptance rate ``sum_x min(p, q)`` rewards; the small CE term only helps early.
* Weights are stored as fp16 safetensors; ``config.json`` says ``float32`` so a plain
  ``from_pretrained(path)`` materialises float32 models.
* Finally the acceptance rate is measured on the held-out prompts (greedy and T=1),
  and ``pair_stats.json`` plus a model card per model directory are written.

Stages can be run separately (``--stages target`` ...); each stage reads what the
earlier ones saved.  Usage::

    python scripts/train_pair.py                 # everything (~30 min on 2 CPU cores)
    python scripts/train_pair.py --threads 1     # what the shipped weights used (busy machine)
    python scripts/train_pair.py --stages eval   # re-measure and rewrite the cards

On a CPU shared with other jobs, two torch threads can be several times slower than one
(the threads wait on each other); the shipped weights were trained with ``--threads 1``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import sys
import time
import types
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
PKG_DIR = REPO / "python" / "specdecode"
DEMO_DIR = PKG_DIR / "demo"
STAGES = ("tokenizer", "target", "draft", "eval")


def _import_demo():
    """Import ``specdecode.demo`` from this checkout without running ``specdecode/__init__``.

    The package's ``__init__`` may import the compiled extension, which this script does
    not need, and a stale editable install may not know the demo package yet; so the
    parent is a bare stub (unless already imported) and the demo package is loaded from
    its file in this checkout.
    """
    if "specdecode" not in sys.modules:
        stub = types.ModuleType("specdecode")
        stub.__path__ = [str(PKG_DIR)]  # type: ignore[attr-defined]
        sys.modules["specdecode"] = stub
    spec = importlib.util.spec_from_file_location(
        "specdecode.demo", DEMO_DIR / "__init__.py", submodule_search_locations=[str(DEMO_DIR)]
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules["specdecode.demo"] = mod
    spec.loader.exec_module(mod)
    return mod


demo = _import_demo()
from specdecode.demo import corpus  # noqa: E402
from specdecode.demo.acceptance import estimate_acceptance  # noqa: E402
from pair_training_utils import (  # noqa: E402  (this folder is on sys.path when run as a script)
    EOS,
    log,
    load_stats,
    save_stats,
    n_params,
    train_tokenizer,
    load_tokenizer,
    encode_stream,
    val_batches,
    val_loss,
    make_config,
    save_model,
    load_model,
    train_loop,
)


# --------------------------------------------------------------------------- utils
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", type=Path, default=DEMO_DIR / "weights")
    p.add_argument("--prompts-file", type=Path, default=DEMO_DIR / "prompts.json")
    p.add_argument("--stages", default=",".join(STAGES), help=f"comma list from {STAGES}")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=2,
                   help="torch threads; on a CPU shared with other jobs 1 thread can be much faster")
    p.add_argument("--no-bf16", dest="bf16", action="store_false",
                   help="disable bf16 autocast for training forward/backward (master weights stay fp32)")
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--eval-batches", type=int, default=12, help="val batches for periodic evals")
    # target
    p.add_argument("--target-hidden", type=int, default=256)
    p.add_argument("--target-layers", type=int, default=6)
    p.add_argument("--target-heads", type=int, default=4)
    p.add_argument("--target-intermediate", type=int, default=688)
    p.add_argument("--target-steps", type=int, default=600)
    p.add_argument("--target-lr", type=float, default=2e-3)
    # draft
    p.add_argument("--draft-hidden", type=int, default=96)
    p.add_argument("--draft-layers", type=int, default=2)
    p.add_argument("--draft-heads", type=int, default=3)
    p.add_argument("--draft-intermediate", type=int, default=256)
    p.add_argument("--draft-steps", type=int, default=400)
    p.add_argument("--draft-lr", type=float, default=3e-3)
    p.add_argument("--draft-kl-weight", type=float, default=0.9, help="w in w*KL + (1-w)*CE")
    # shared optimisation
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0)
    # prompts / acceptance
    p.add_argument("--prompts-per-file", type=int, default=4)
    p.add_argument("--accept-new-tokens", type=int, default=64)
    args = p.parse_args(argv)
    args.stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    bad = set(args.stages) - set(STAGES)
    if bad:
        p.error(f"unknown stages {sorted(bad)}")
    return args


def load_corpus() -> dict[str, list[tuple[str, str]]]:
    splits: dict[str, list[tuple[str, str]]] = {"train": [], "val": [], "heldout": []}
    for rel, text, split in corpus.iter_stdlib_sources():
        splits[split].append((rel, text))
    return splits



def stage_tokenizer(args, splits) -> None:
    t0 = time.time()
    train_texts = [t for _, t in splits["train"]]
    fast = train_tokenizer(train_texts, args.vocab_size, args.seq_len, [args.out_dir / "target", args.out_dir / "draft"])
    prompts = []
    for rel, text in splits["heldout"]:
        for pr in corpus.extract_prompts(text, per_file=args.prompts_per_file):
            prompts.append({"file": rel, "text": pr})
    args.prompts_file.write_text(
        json.dumps(
            {
                "description": "Held-out prompts: windows starting at def/class lines of stdlib files "
                "never used for training (see specdecode.demo.corpus).",
                "python_version": platform.python_version(),
                "prompts": prompts,
            },
            indent=1,
        )
        + "\n"
    )
    n_tok = {k: int(encode_stream(fast, [t for _, t in v]).numel()) for k, v in splits.items()}
    stats = load_stats(args.out_dir)
    stats["corpus"] = {
        "source": "CPython standard library .py files",
        "python_version": platform.python_version(),
        "excluded_dirs": sorted(corpus.EXCLUDED_DIRS),
        "files": {k: len(v) for k, v in splits.items()},
        "chars": {k: sum(len(t) for _, t in v) for k, v in splits.items()},
        "tokens": n_tok,
        "n_prompts": len(prompts),
    }
    stats["tokenizer"] = {"type": "byte-level BPE", "vocab_size": fast.vocab_size + 0, "special": [EOS]}
    stats["tokenizer_seconds"] = round(time.time() - t0, 1)
    save_stats(args.out_dir, stats)
    log(f"tokenizer: vocab {len(fast)}, tokens {n_tok}, {len(prompts)} held-out prompts")


def stage_target(args, splits) -> None:
    from transformers import LlamaForCausalLM

    tok = load_tokenizer(args.out_dir / "target")
    train_stream = encode_stream(tok, [t for _, t in splits["train"]])
    val_stream = encode_stream(tok, [t for _, t in splits["val"]])
    val_b = val_batches(val_stream, args.batch_size, args.seq_len, args.eval_batches)
    torch.manual_seed(args.seed)
    eos = tok.convert_tokens_to_ids(EOS)
    cfg = make_config(len(tok), args.target_hidden, args.target_layers, args.target_heads,
                      args.target_intermediate, args.seq_len, eos)
    model = LlamaForCausalLM(cfg)
    log(f"target params: {n_params(model):,}")

    def lm_loss(xb):
        logits = model(input_ids=xb[:, :-1]).logits.float()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), xb[:, 1:].reshape(-1))

    res = train_loop(model, lm_loss, train_stream, val_b, args, args.target_steps, args.target_lr, "target")
    save_model(model, args.out_dir / "target", tok)
    stats = load_stats(args.out_dir)
    stats["target"] = {
        "architecture": "LlamaForCausalLM",
        "hidden_size": args.target_hidden,
        "num_hidden_layers": args.target_layers,
        "num_attention_heads": args.target_heads,
        "intermediate_size": args.target_intermediate,
        "params": n_params(model),
        "objective": "next-token cross-entropy",
        "steps": args.target_steps,
        "batch_size": args.batch_size,
        "seq_len": args.seq_len,
        "tokens_seen": args.target_steps * args.batch_size * args.seq_len,
        "lr": args.target_lr,
        "warmup": args.warmup,
        "min_lr_ratio": args.min_lr_ratio,
        "weight_decay": args.weight_decay,
        "seed": args.seed,
        "threads": args.threads,
        "bf16_autocast": args.bf16,
        **res,
    }
    save_stats(args.out_dir, stats)


def stage_draft(args, splits) -> None:
    from transformers import LlamaForCausalLM

    tok = load_tokenizer(args.out_dir / "target")
    target = load_model(args.out_dir / "target")  # the shipped, fp16-rounded target
    for p in target.parameters():
        p.requires_grad_(False)
    train_stream = encode_stream(tok, [t for _, t in splits["train"]])
    val_stream = encode_stream(tok, [t for _, t in splits["val"]])
    val_b = val_batches(val_stream, args.batch_size, args.seq_len, args.eval_batches)
    torch.manual_seed(args.seed + 1)
    eos = tok.convert_tokens_to_ids(EOS)
    cfg = make_config(len(tok), args.draft_hidden, args.draft_layers, args.draft_heads,
                      args.draft_intermediate, args.seq_len, eos)
    model = LlamaForCausalLM(cfg)
    log(f"draft params: {n_params(model):,} (target {n_params(target):,}, "
        f"ratio {n_params(target) / n_params(model):.2f}x)")
    w = args.draft_kl_weight

    def distill_loss(xb):
        inp, labels = xb[:, :-1], xb[:, 1:]
        with torch.no_grad():
            t_logp = F.log_softmax(target(input_ids=inp).logits.float(), dim=-1)
        d_logits = model(input_ids=inp).logits.float()
        d_logp = F.log_softmax(d_logits, dim=-1)
        kl = (t_logp.exp() * (t_logp - d_logp)).sum(-1).mean()
        if w >= 1.0:
            return kl
        ce = F.nll_loss(d_logp.reshape(-1, d_logp.shape[-1]), labels.reshape(-1))
        return w * kl + (1 - w) * ce

    res = train_loop(model, distill_loss, train_stream, val_b, args, args.draft_steps, args.draft_lr, "draft")
    save_model(model, args.out_dir / "draft", tok)
    stats = load_stats(args.out_dir)
    stats["draft"] = {
        "architecture": "LlamaForCausalLM",
        "hidden_size": args.draft_hidden,
        "num_hidden_layers": args.draft_layers,
        "num_attention_heads": args.draft_heads,
        "intermediate_size": args.draft_intermediate,
        "params": n_params(model),
        "objective": f"distillation from target: {w} * KL(p_target || q_draft) + {1 - w:.2g} * CE",
        "steps": args.draft_steps,
        "batch_size": args.batch_size,
        "seq_len": args.seq_len,
        "tokens_seen": args.draft_steps * args.batch_size * args.seq_len,
        "lr": args.draft_lr,
        "warmup": args.warmup,
        "min_lr_ratio": args.min_lr_ratio,
        "weight_decay": args.weight_decay,
        "seed": args.seed + 1,
        "threads": args.threads,
        "bf16_autocast": args.bf16,
        **res,
    }
    save_stats(args.out_dir, stats)


def stage_eval(args, splits) -> None:
    t0 = time.time()
    target, draft, tok = demo.load_demo_pair(weights_dir=args.out_dir)
    val_stream = encode_stream(tok, [t for _, t in splits["val"]])
    val_b = val_batches(val_stream, args.batch_size, args.seq_len)
    stats = load_stats(args.out_dir)
    for name, model in (("target", target), ("draft", draft)):
        vl = val_loss(model, val_b)
        stats.setdefault(name, {})["final_val_loss"] = round(vl, 4)
        stats[name]["final_val_tokens"] = sum(int(b[:, 1:].numel()) for b in val_b)
        log(f"{name}: final val loss (shipped fp16 weights, full val split) {vl:.4f}")
    prompts = [p["text"] for p in json.loads(args.prompts_file.read_text())["prompts"]]
    acc = {}
    for temp, key in ((0.0, "greedy"), (1.0, "t1")):
        est = estimate_acceptance(target, draft, tok, prompts, max_new_tokens=args.accept_new_tokens,
                                  temperature=temp, seed=args.seed)
        acc[key] = {
            "alpha": round(est.alpha, 4),
            "temperature": temp,
            "n_prompts": est.n_prompts,
            "n_positions": est.n_positions,
            "max_new_tokens": est.max_new_tokens,
            "min_prompt_alpha": round(min(est.per_prompt), 4),
        }
        log(f"acceptance {key}: alpha={est.alpha:.4f} over {est.n_positions} positions")
    # a quick check used by the tests: first 8 prompts, 32 new tokens, greedy
    quick = estimate_acceptance(target, draft, tok, prompts[:8], max_new_tokens=32, temperature=0.0)
    acc["greedy_quick"] = {"alpha": round(quick.alpha, 4), "n_prompts": 8, "max_new_tokens": 32,
                           "temperature": 0.0}
    stats["acceptance"] = acc
    stats["acceptance"]["definition"] = (
        "greedy: mean over target-greedy continuation positions of [argmax draft == argmax target]; "
        "t1: mean of sum_x min(p(x), q(x)) along target-sampled (T=1) continuations"
    )
    stats["eval_seconds"] = round(time.time() - t0, 1)
    stats["param_ratio"] = round(stats["target"]["params"] / stats["draft"]["params"], 2)
    stats["benchmark_pair"] = measure_benchmark_cost(target, draft)
    save_stats(args.out_dir, stats)
    save_stats(args.out_dir, stats)
    write_model_cards(args.out_dir, stats)


def measure_benchmark_cost(target, draft) -> dict:
    """Per-token decode cost of draft, trained target and the enlarged benchmark target."""
    big = demo.enlarge_model(target)
    ids = torch.arange(1, 129).unsqueeze(0)
    with torch.no_grad():
        max_diff = (big(input_ids=ids).logits - target(input_ids=ids).logits).abs().max().item()
    times = {"draft": [], "target": [], "enlarged_target": []}
    for _ in range(3):  # interleave to share any background load fairly
        for name, model in (("draft", draft), ("target", target), ("enlarged_target", big)):
            times[name].append(demo.decode_step_seconds(model, context_len=128, steps=32, repeats=1))
    med = {k: sorted(v)[1] for k, v in times.items()}
    res = {
        "extra_layers": demo.BENCHMARK_EXTRA_LAYERS,
        "intermediate_size": demo.BENCHMARK_INTERMEDIATE_SIZE,
        "num_hidden_layers": big.config.num_hidden_layers,
        "params": n_params(big),
        "max_abs_logit_diff_vs_target": max_diff,
        "decode_step_ms": {k: round(v * 1e3, 3) for k, v in med.items()},
        "cost_ratio_enlarged_vs_draft": round(med["enlarged_target"] / med["draft"], 1),
        "cost_ratio_target_vs_draft": round(med["target"] / med["draft"], 1),
        "torch_threads": torch.get_num_threads(),
        "note": "median KV-cached single-token decode step, context 128, this training machine's CPU",
    }
    log(f"benchmark pair: {res['decode_step_ms']} ms/step, enlarged/draft = {res['cost_ratio_enlarged_vs_draft']}x, "
        f"max |dlogit| = {max_diff:.2e}")
    del big
    return res


def write_model_cards(out_dir: Path, stats: dict) -> None:
    c, acc = stats["corpus"], stats["acceptance"]
    for name in ("target", "draft"):
        s = stats[name]
        hist = "\n".join(f"| {h['step']} | {h['train_loss_ema']:.4f} | {h['val_loss']:.4f} |" for h in s["history"])
        other = "draft" if name == "target" else "target"
        bench = ""
        if "benchmark_pair" in stats:
            b = stats["benchmark_pair"]
            ms = b["decode_step_ms"]
            bench = f"""
## Cost-realistic benchmark pair
`specdecode.demo.load_benchmark_pair()` pairs the draft with a *function-preserving
enlargement* of the target (`enlarge_model`: MLPs widened to {b['intermediate_size']} with zero
`down_proj` columns, plus {b['extra_layers']} interleaved pass-through layers with zero `o_proj`/`down_proj`;
{b['num_hidden_layers']} layers, {b['params']:,} params, max |logit difference| {b['max_abs_logit_diff_vs_target']:.1e}).
KV-cached single-token decode step, context 128: draft {ms['draft']:.2f} ms, trained target
{ms['target']:.2f} ms ({b['cost_ratio_target_vs_draft']}x), enlarged target {ms['enlarged_target']:.2f} ms
(**{b['cost_ratio_enlarged_vs_draft']}x the draft**).
"""
        card = f"""# specdecode demo {name} model

Tiny `LlamaForCausalLM` trained from scratch on CPU as the **{name}** half of the
`specdecode` demo speculative-decoding pair (its partner lives in `../{other}`).
It writes Python-looking code; it is a test fixture, not a useful model.

Load with `specdecode.demo.load_demo_pair()` or
`AutoModelForCausalLM.from_pretrained(path)` / `AutoTokenizer.from_pretrained(path)`.
Weights are stored in float16; `config.json` declares float32, so loading gives float32.

## Corpus
CPython {c['python_version']} standard-library `.py` files (excluding directories
{', '.join('`' + d + '`' for d in c['excluded_dirs'])}), split by SHA-256 of the
relative path: train {c['files']['train']} files / {c['tokens']['train']:,} tokens,
validation {c['files']['val']} files / {c['tokens']['val']:,} tokens,
held-out {c['files']['heldout']} files (only used for the {c['n_prompts']} prompts in `demo/prompts.json`).
Tokenizer: byte-level BPE, vocab {stats['tokenizer']['vocab_size']}, `<|endoftext|>` = bos/eos/pad,
shared by both models.

## Recipe
| | |
|---|---|
| architecture | {s['architecture']}, hidden {s['hidden_size']}, {s['num_hidden_layers']} layers, {s['num_attention_heads']} heads, MLP {s['intermediate_size']}, tied embeddings |
| parameters | {s['params']:,} |
| objective | {s['objective']} |
| steps x batch x seq | {s['steps']} x {s['batch_size']} x {s['seq_len']} ({s['tokens_seen']:,} tokens) |
| optimiser | AdamW (0.9, 0.95), lr {s['lr']}, {s['warmup']} warmup steps, cosine to {s['min_lr_ratio']} x lr, weight decay {s['weight_decay']}, grad clip 1.0 |
| seed | {s['seed']} |
| precision | fp32 master weights, {'bf16 autocast' if s.get('bf16_autocast', True) else 'fp32'} forward/backward |
| training time | {s['train_seconds'] / 60:.1f} min, {s.get('threads', 2)} torch thread(s) on a shared 2-core CPU (torch {torch.__version__}) |
| **final validation loss** | **{s['final_val_loss']:.4f}** nats/token (shipped weights, {s['final_val_tokens']:,} val tokens) |

Reproduce: `python scripts/train_pair.py{'' if s.get('threads', 2) == 2 else ' --threads ' + str(s['threads'])}`
(the defaults are the recipe above; the tokenizer stage is deterministic).

| step | train loss (EMA) | val loss (subset) |
|---|---|---|
{hist}

## Acceptance rate of the pair
Draft {stats['draft']['params']:,} params vs target {stats['target']['params']:,} ({stats['param_ratio']}x fewer).
Measured with `specdecode.demo.acceptance.estimate_acceptance` on all
{acc['greedy']['n_prompts']} held-out prompts, {acc['greedy']['max_new_tokens']} target tokens each:

* greedy (T=0), mean [argmax draft == argmax target] along target-greedy continuations:
  **alpha = {acc['greedy']['alpha']:.4f}** ({acc['greedy']['n_positions']} positions)
* T=1, mean of sum_x min(p(x), q(x)) along target-sampled continuations:
  **alpha = {acc['t1']['alpha']:.4f}** ({acc['t1']['n_positions']} positions)

{bench}
Machine-readable numbers: `../pair_stats.json`.
"""
        (out_dir / name / "README.md").write_text(card)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t0 = time.time()
    splits = load_corpus()
    log(f"corpus: { {k: len(v) for k, v in splits.items()} } files")
    for stage in args.stages:
        log(f"=== stage {stage} ===")
        {"tokenizer": stage_tokenizer, "target": stage_target, "draft": stage_draft, "eval": stage_eval}[stage](
            args, splits
        )
    log(f"done in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
