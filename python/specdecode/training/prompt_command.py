"""``python -m specdecode prompts --target NAME --out FILE.jsonl.gz [--mix MIX] [--count N]
[--device cuda]``: the widened prompts made once, ahead of a run, into a prompt file that
``train --prompts FILE`` draws from. Every argument is checked when it is parsed, before the
target is loaded."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from specdecode import cli_args
from specdecode.training.command import _device, _positive, _target

PROMPTS_DESCRIPTION = """\
Make the prompts that widen a run's default prompts beyond the templates, once, ahead of the
run (on any machine, faster on a GPU), and write them into one
compressed prompt file (.jsonl.gz): self-instruct requests the target writes from seed topics,
multi-turn exchanges with the target's own first answer (stored as chat messages, so the file
does not depend on a tokenizer), and code, prose and long requests. The benchmark's held-out
prompts are kept out (docs/training.md, "Prompts beyond the templates"). A run given the file
(train --prompts FILE --prompt-mix ...) draws those sources from it and asks the target for
none; for --target smollm2 the kit ships such a file and uses it by default.

examples:
  python -m specdecode prompts --target demo --out runs/demo-prompts.jsonl.gz --count 64
  python -m specdecode prompts --target smollm2 --out runs/smol-prompts.jsonl.gz --count 6000 \\
      --batch-size 32 --threads 1 --minutes 85      (how the shipped file was made, on a 2-core CPU)
  python -m specdecode prompts --target smollm2 --device cuda --count 40000 --out runs/smol-40k.jsonl.gz \\
      --mix self-instruct=1,multi-turn=1,code=0.2,prose=0.2"""


def _out(text: str) -> Path:
    from specdecode.training.prompt_file import SUFFIX

    path = Path(text)
    if not path.name.endswith(SUFFIX) or path.name == SUFFIX:
        raise ValueError(f"out: a prompt file's name ends with {SUFFIX}, got {text!r}")
    if path.is_dir():
        raise ValueError(f"out: {text!r} is a folder")
    return path


def _mix(text: str) -> Any:
    from specdecode.training.widen import file_mix

    return file_mix(text)


def prompts_parser(sub: Any) -> argparse.ArgumentParser:
    """The ``prompts`` subcommand's parser, added to ``sub``."""
    p = sub.add_parser("prompts", help="make a run's widened prompts once, into a prompt file "
                                       "(python -m specdecode prompts --help)",
                       description=PROMPTS_DESCRIPTION, formatter_class=cli_args.HelpFormatter)
    p.add_argument("--target", required=True, type=cli_args.checked(_target, "target"),
                   help="'demo', 'smollm2' or a Hugging Face model folder: the target that writes the prompts")
    p.add_argument("--out", required=True, type=cli_args.checked(_out, "out"),
                   help="the prompt file to write (its name ends with .jsonl.gz)")
    p.add_argument("--mix", type=cli_args.checked(_mix, "mix"), default="self-instruct=1,multi-turn=1",
                   help="shares of --count by source: self-instruct, multi-turn, code, prose, long")
    p.add_argument("--count", type=cli_args.int_at_least("count", 1), default=2000,
                   help="prompts in all, shared by the sources of --mix")
    p.add_argument("--device", type=cli_args.checked(_device, "device"), default=None,
                   help="where the target runs: cpu or cuda (default: the CPU)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                   help="the target's precision on the device (default float32)")
    p.add_argument("--batch-size", type=cli_args.int_at_least("batch_size", 1), default=None,
                   help="prompts per generate call (default on the CPU: 64 with AVX-512, else 32; on a GPU up to "
                        "1024, as its memory allows)")
    p.add_argument("--minutes", type=_positive("minutes"), default=None,
                   help="stop the target's sources after this long and write what they made (default: no limit)")
    p.add_argument("--seed", type=cli_args.int_at_least("seed", 0), default=0, help="random seed")
    p.add_argument("--threads", type=cli_args.int_at_least("threads", 1), default=None,
                   help="torch CPU threads (default: torch's choice)")
    return p


def run_prompts(args: argparse.Namespace) -> dict[str, Any]:
    """Make the prompt file as the arguments say and print what it holds. Returns its header."""
    import torch

    from specdecode.training.data import DataSettings
    from specdecode.training.device import check_device, check_dtype, memory_errors, place_target
    from specdecode.training.prompt_file import read_header
    from specdecode.training.targets import load_target
    from specdecode.training.widen import make_prompt_file

    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.monotonic()
    device, dtype = check_device(args.device), check_dtype(args.dtype)
    target, tokenizer = load_target(args.target)
    with memory_errors(f"moving the target to {device}", "use a smaller target or --dtype bfloat16"):
        target = place_target(target, device, dtype, owned=True)
    deadline = None if args.minutes is None else start + 60.0 * args.minutes
    with memory_errors("making the prompts", "lower --batch-size"):
        path = make_prompt_file(target, tokenizer, args.out, target_name=args.target, mix=args.mix,
                                count=args.count, settings=DataSettings(batch_size=args.batch_size), seed=args.seed,
                                progress=True, deadline=deadline)
    header = read_header(path)
    held = ", ".join(f"{n} {name}" for name, n in header["counts"].items()) or "nothing"
    print(f"prompts: {held} -> {path} ({path.stat().st_size / 2**20:.2f} MiB, {header['seconds']:.0f} s of "
          f"generation, {time.monotonic() - start:.0f} s in all)")
    asked = header["asked"]
    short = [f"{name} {header['counts'].get(name, 0)} of {n}" for name, n in asked.items()
             if header["counts"].get(name, 0) < n]
    if short:
        print(f"fewer than asked (--minutes, or too few new requests): {', '.join(short)}")
    print(f"use it: python -m specdecode train KIND --target {args.target} --prompts {path} "
          f"--prompt-mix templates=0.5,self-instruct=0.25,multi-turn=0.25 ...")
    return header
