#!/usr/bin/env python
"""Copy a trained drafter folder with its floating-point weights stored in half precision.

    python scripts/export_drafter.py runs/smol-eagle python/specdecode/pair_drafters/smollm2-eagle

What ``python -m specdecode train`` writes is float32 with a training checkpoint and a data
cache beside it; what ships inside the package is only the drafter: ``model.safetensors`` in
float16 (or ``--dtype bfloat16``), its kind's JSON config and ``specdecode_drafter.json``.
With ``--num-draft-tokens`` / ``--tree`` / ``--num-nodes`` / ``--tree-depth`` the copy's record
gets a ``"generation"`` entry: the settings measured best for the drafter, which
``specdecode.load_drafter`` applies (the tree it drafts, the draft length ``generate`` uses when
not told). ``--sampling-tree none`` (a chain) / ``--sampling-num-draft-tokens`` add its
``"sampling"`` entry: what ``generate`` drafts instead when it samples. Loading casts the weights back to the target's dtype (``load_state_dict`` copies into the
drafter's own float32 parameters), so a shipped drafter drafts like the trained one up to the
half-precision rounding of its weights. The work is done by
:func:`specdecode.training.export.export_drafter` (``python -m specdecode train ... --export DIR``
writes such copies of the drafters it trains).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from specdecode.training.export import export_drafter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", type=Path, help="a folder written by python -m specdecode train")
    parser.add_argument("dst", type=Path, help="where the copy goes")
    parser.add_argument("--dtype", choices=["float16", "bfloat16"], default="float16")
    parser.add_argument("--num-draft-tokens", type=int, help="the draft length generate uses when not told")
    parser.add_argument("--tree", choices=["dynamic", "sequoia", "static"], help="the tree the drafter drafts")
    parser.add_argument("--num-nodes", type=int, help="with --tree: its size, root included")
    parser.add_argument("--tree-depth", type=int, help="with --tree: its deepest draft")
    parser.add_argument("--sampling-tree", choices=["none", "dynamic", "sequoia", "static"],
                        help="when generate samples: this tree instead ('none': a chain)")
    parser.add_argument("--sampling-num-draft-tokens", type=int, help="when generate samples: this draft length")
    args = parser.parse_args()
    settings = {"num_draft_tokens": args.num_draft_tokens, "tree": args.tree, "num_nodes": args.num_nodes,
                "tree_depth": args.tree_depth}
    settings = {k: v for k, v in settings.items() if v is not None}
    sampling = {}
    if args.sampling_tree is not None:
        sampling["tree"] = None if args.sampling_tree == "none" else args.sampling_tree
    if args.sampling_num_draft_tokens is not None:
        sampling["num_draft_tokens"] = args.sampling_num_draft_tokens
    if sampling:
        settings["sampling"] = sampling
    size = export_drafter(args.src, args.dst, dtype=args.dtype, generation=settings or None)
    print(f"{args.dst}: weights {size / 1e6:.2f} MB ({args.dtype})")


if __name__ == "__main__":
    main()
