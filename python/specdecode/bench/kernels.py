"""Operations launched by one step of the static decode path, by phase: what a CUDA graph of
that step replays, counted on the CPU.

    python benchmarks/bench_tree_kernels.py            # demo pair and a small EAGLE drafter
    python benchmarks/bench_tree_kernels.py --quick    # fewer timed runs, a short acceptance table

Every aten operation that runs while a phase of the step runs (draft, target, verify,
bookkeeping: :class:`~specdecode.engine.graphs.StepProgram`'s phases) is counted by a
``TorchDispatchMode``, as a *kernel* (an operation that computes or copies: on a GPU one or a
few kernel launches), a *view* (no data touched: views, ``expand``, ``empty``), or a *host read*
(``item`` and the like; none may run inside a step). A compiled ``torch.ops.specdecode`` op
counts once. Kernels that run inside a model's forward (the target's, the drafter's network)
are counted apart from the step's own tensor work, its *bookkeeping*: the draft forwards cost
the same however the tree around them is built, and the bookkeeping is what tree drafting adds
to a chain (expansion and re-ranking, masks, the accepted path's moves).

Counts are per step: one generation is run to build the layout, then a second one counted, and
its totals divided by the steps it ran (every step of a static generation runs the same
operations). A time per step on the CPU (the static path's phase clocks; median over
``--repeats`` generations of each configuration, run in interleaved rounds per drafter) is given as a ratio
to the chain's, measured in the same run: on the CPU it is mostly the forwards' arithmetic.

A second table (:func:`acceptance`) gives what the kernels buy: tokens per step of dynamic
trees on the static path, raw values against calibrated ones (:mod:`specdecode.trees.static_calibration`),
at a fixed depth and at the depth a kept builder chose (:mod:`specdecode.trees.static_depth`),
with the eager calibrated builder and the chain for reference.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: Operations that allocate or describe memory without touching it (no kernel on a GPU).
#: (``scalar_tensor``: a Python number wrapped for an operation, ``torch.where(c, x, 0)``, made
#: on the host.)
NO_KERNEL = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh",
             "detach", "alias", "_unsafe_view", "set_", "resize_", "is_same_size", "scalar_tensor"}
#: Operations that read a tensor's value on the host.
HOST_READS = {"_local_scalar_dense", "item", "equal", "is_nonzero"}


def classify(func: Any) -> str:
    """``"kernel"``, ``"view"`` or ``"host_read"`` for an operation seen by the dispatcher."""
    name = func.__name__.split(".")[0] if hasattr(func, "__name__") else str(func)
    if name in HOST_READS:
        return "host_read"
    if getattr(func, "is_view", False) or name in NO_KERNEL:
        return "view"
    return "kernel"


class OpCounter(TorchDispatchMode):
    """Counts operations by ``(phase, where, kind)``: ``where`` is ``"forward"`` inside a
    watched model's forward (:meth:`watch`), else ``"bookkeeping"``; ``kind`` by
    :func:`classify`. ``phase`` is set by :meth:`phased`; operations outside phases are not counted."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter = Counter()
        self.names: Counter = Counter()
        self.phase: str | None = None
        self._depth = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if self.phase is not None:
            kind = classify(func)
            where = "forward" if self._depth else "bookkeeping"
            self.counts[(self.phase, where, kind)] += 1
            if kind == "kernel" and where == "bookkeeping":
                self.names[(self.phase, str(func))] += 1
        return func(*args, **(kwargs or {}))

    def watch(self, model: torch.nn.Module) -> Callable[[], None]:
        """Count ``model``'s forward apart; returns the function that stops watching it."""
        def enter(*_: Any) -> None:
            self._depth += 1

        def leave(*_: Any) -> None:
            self._depth -= 1

        handles = [model.register_forward_pre_hook(enter), model.register_forward_hook(leave)]
        return lambda: [h.remove() for h in handles]

    def phased(self, name: str, fn: Callable[[], None]) -> Callable[[], None]:
        """``fn`` with its operations counted under phase ``name``."""
        def run() -> None:
            self.phase = name
            try:
                fn()
            finally:
                self.phase = None
        return run


@dataclass
class StepCounts:
    """Operations of one step, per phase (``{phase: {"forward": n, "bookkeeping": n}}`` kernels),
    the host reads inside steps, and the bookkeeping kernels by operation name."""

    kernels: dict[str, dict[str, float]]
    host_reads: float
    by_name: dict[tuple[str, str], float] = field(default_factory=dict)

    def total(self, where: str | None = None, phases: tuple[str, ...] | None = None) -> float:
        return sum(n for phase, split in self.kernels.items() if phases is None or phase in phases
                   for w, n in split.items() if where is None or w == where)


def _session_of(target: torch.nn.Module) -> Any:
    from specdecode.engine.static_layouts import kept_layouts

    layouts = kept_layouts(target)
    if not layouts:
        raise RuntimeError("no static layout was kept for the target")
    return layouts[-1]  # the most recently used


def count_step(run: Callable[[], Any], target: torch.nn.Module, models: list[torch.nn.Module]) -> StepCounts:
    """Count the operations of one step of the static generation ``run`` (which returns
    ``generate``'s output, ``decode_path="static"``): ``run`` once to build its layout, then
    again with every phase counted; ``models`` are the networks whose forwards count apart."""
    run()
    program = _session_of(target).program
    counter = OpCounter()
    original = list(program.phases)
    program.phases = [(name, counter.phased(name, fn)) for name, fn in original]
    stops = [counter.watch(m) for m in models]
    try:
        with counter:
            out = run()
    finally:
        program.phases = original
        for stop in stops:
            stop()
    steps = out.stats.decode_steps_run
    kernels: dict[str, dict[str, float]] = {}
    for (phase, where, kind), n in counter.counts.items():
        if kind == "kernel":
            kernels.setdefault(phase, {"forward": 0.0, "bookkeeping": 0.0})[where] += n / steps
    reads = sum(n for (_, _, kind), n in counter.counts.items() if kind == "host_read") / steps
    return StepCounts(kernels, reads, {k: n / steps for k, n in counter.names.items()})


def step_seconds(out: Any) -> float:
    """The static path's phase seconds per decoding step of one generation's output."""
    s = out.stats
    return (s.draft_time - s.draft_prefill_time + s.target_time + s.verify_time + s.bookkeeping_time) / max(
        s.decode_steps_run, 1)


def _eagle(target: torch.nn.Module) -> Any:
    """A small EAGLE drafter on ``target`` (one decoder layer started from the target's last, as
    the tests build them): what matters here is the operations, not its acceptance."""
    from specdecode.drafters.eagle import EagleDrafter, EagleModel

    torch.manual_seed(0)
    return EagleDrafter(target, EagleModel(target, (-1,), None, init_from_target=True).eval())


def configurations(draft: torch.nn.Module, eagle: Any, nodes: int, gamma: int) -> list[tuple[str, Any, dict]]:
    """``(label, drafter, generate kwargs)``: chains of ``gamma`` and ``nodes - 1`` drafts, the
    fixed tree ``tree="static"`` and EAGLE-2 dynamic trees (calibrated, the default, at depths 6
    and ``nodes - 1``; raw values at ``nodes - 1``), for the draft model and the EAGLE drafter."""
    from specdecode import ModelDrafter
    from specdecode.trees.builders import DynamicTree

    rows = []
    for name, base in (("model", ModelDrafter(draft)), ("eagle", eagle)):
        rows.append((f"{name} chain {gamma}", base, dict(num_draft_tokens=gamma)))
        rows.append((f"{name} chain {nodes - 1}", base, dict(num_draft_tokens=nodes - 1)))
        rows.append((f"{name} static {nodes}", base.with_tree("static", num_nodes=nodes), {}))
        rows.append((f"{name} dynamic {nodes} d=6", base.with_tree(DynamicTree(nodes, 6)), {}))
        rows.append((f"{name} dynamic {nodes} d={nodes - 1}", base.with_tree(DynamicTree(nodes, nodes - 1)), {}))
        rows.append((f"{name} dynamic raw {nodes} d={nodes - 1}",
                     base.with_tree(DynamicTree(nodes, nodes - 1, calibrated=False)), {}))
    return rows


def run(args: Any) -> list[dict[str, Any]]:
    import specdecode
    from specdecode.demo import demo_prompts, load_demo_pair

    torch.set_num_threads(args.threads)
    target, draft, tokenizer = load_demo_pair()
    ids = tokenizer(demo_prompts(1)[0], return_tensors="pt").input_ids[:, -64:]
    eagle = _eagle(target)
    rows: list[dict[str, Any]] = []
    runs: list[Callable[[], Any]] = []
    for label, drafter, kwargs in configurations(draft, eagle, args.nodes, args.gamma):
        def generate(drafter: Any = drafter, kwargs: dict = kwargs) -> Any:
            return specdecode.generate(target, drafter, ids, max_new_tokens=args.max_new_tokens, eos_token_id=[],
                                       decode_path="static", **kwargs)

        networks = [target] + [m for m in (getattr(drafter, "model", None),) if isinstance(m, torch.nn.Module)]
        counts = count_step(generate, target, networks)
        draft_fwd = counts.kernels.get("draft", {}).get("forward", 0.0)
        rows.append({
            "step": label, "draft fwd": draft_fwd, "draft bk": counts.kernels.get("draft", {}).get("bookkeeping", 0.0),
            "target fwd": counts.kernels.get("target", {}).get("forward", 0.0),
            "target bk": counts.kernels.get("target", {}).get("bookkeeping", 0.0),
            "verify": counts.total(phases=("verify",)), "commit": counts.total(phases=("bookkeeping",)),
            "total": counts.total(), "total - draft fwd": counts.total() - draft_fwd,
            "host reads": counts.host_reads, "by_name": counts.by_name,
        })
        runs.append(generate)
    seconds: list[list[float]] = [[] for _ in runs]
    families = {row["step"].split()[0]: [] for row in rows}
    for i, row in enumerate(rows):
        families[row["step"].split()[0]].append(i)
    for members in families.values():  # interleaved rounds per family (its layouts all stay kept)
        for _ in range(args.repeats):
            for i in members:
                seconds[i].append(step_seconds(runs[i]()))
    base: dict[Any, dict[str, Any]] = {}
    for row, times in zip(rows, seconds):
        row["seconds"] = statistics.median(times)
        family, method = row["step"].split()[:2]
        if method == "chain":  # the first chain of a family is the baseline, the last one as deep as the trees
            base.setdefault(family, row)
            base[(family, "deep")] = row
    for row in rows:
        family = row["step"].split()[0]
        row["x chain (ops)"] = row["total - draft fwd"] / base[family]["total - draft fwd"]
        row["x deep chain (ops)"] = row["total - draft fwd"] / base[(family, "deep")]["total - draft fwd"]
        row["x chain (CPU s/step)"] = row["seconds"] / base[family]["seconds"]
    return rows


def acceptance(args: Any) -> list[dict[str, Any]]:
    """Tokens per step (target call) of dynamic trees of ``args.nodes`` nodes on the static path,
    raw and calibrated, against the eager calibrated builder and the chain: the demo pair,
    ``args.acceptance_prompts`` held-out prompts one at a time, ``args.acceptance_tokens`` new
    tokens, greedy, EOS off. ``depth``: the deepest tree drafted (the plan's depth for the
    static path)."""
    import specdecode
    from specdecode.demo import demo_prompts, load_demo_pair
    from specdecode.trees.builders import DynamicTree

    target, draft, tokenizer = load_demo_pair()
    N = args.nodes
    kept: dict[int, Any] = {}

    def kept_drafter(i: int) -> Any:  # one builder per prompt, kept for its second generation
        return kept.setdefault(i, specdecode.ModelDrafter(draft, tree=DynamicTree(N)))

    methods: list[tuple[str, Callable[[int], Any], dict]] = [
        (f"chain {args.gamma}, static", lambda i: draft, dict(num_draft_tokens=args.gamma, decode_path="static")),
        (f"dynamic raw d={N - 1}, static",
         lambda i: specdecode.ModelDrafter(draft, tree=DynamicTree(N, N - 1, calibrated=False)),
         dict(decode_path="static")),
        ("dynamic d=6, static", lambda i: specdecode.ModelDrafter(draft, tree=DynamicTree(N, 6)),
         dict(decode_path="static")),
        (f"dynamic d={N - 1}, static", lambda i: specdecode.ModelDrafter(draft, tree=DynamicTree(N, N - 1)),
         dict(decode_path="static")),
        ("dynamic kept, 1st generation, static", kept_drafter, dict(decode_path="static")),
        ("dynamic kept, 2nd generation, static", kept_drafter, dict(decode_path="static")),
        ("dynamic, eager", lambda i: draft, dict(tree="dynamic", num_nodes=N)),
    ]
    prompts = [tokenizer(t, return_tensors="pt").input_ids[:, -96:]
               for t in demo_prompts()[: args.acceptance_prompts]]
    rows = []
    for label, drafter_for, kwargs in methods:
        per_step, depths = [], []
        for i, ids in enumerate(prompts):
            out = specdecode.generate(target, drafter_for(i), ids, max_new_tokens=args.acceptance_tokens,
                                      eos_token_id=[], **kwargs)
            per_step.append(out.stats.block_efficiency)
            depths.append(len(out.stats.position_drafted))
        rows.append({"method": label, "tokens per step": statistics.mean(per_step),
                     "by prompt": " ".join(f"{v:.2f}" for v in per_step), "depth": max(depths)})
    return rows


def _count(value: float) -> str:
    return f"{value:.0f}" if value == int(value) else f"{value:.1f}"


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    from specdecode.bench.harness import Column, base_parser, format_table
    from specdecode.cli_args import int_at_least

    parser = base_parser("Kernels per phase of one static-path step: chains, fixed and dynamic trees", prog=prog)
    parser.add_argument("--nodes", type=int_at_least("nodes", 3), default=16, help="tree nodes, root included")
    parser.add_argument("--gamma", type=int_at_least("gamma", 1), default=5, help="the chain's draft tokens")
    parser.add_argument("--max-new-tokens", type=int_at_least("max_new_tokens", 2), default=48)
    parser.add_argument("--threads", type=int_at_least("threads", 1), default=1)
    parser.add_argument("--names", action="store_true", help="also list the bookkeeping kernels of each step by name")
    parser.add_argument("--acceptance-prompts", type=int_at_least("acceptance_prompts", 0), default=None,
                        help="prompts of the tokens-per-step table (0: no table; default 2, --quick 1)")
    parser.add_argument("--acceptance-tokens", type=int_at_least("acceptance_tokens", 2), default=None,
                        help="new tokens per prompt of that table (default 512, --quick 96)")
    args = parser.parse_args(argv)
    if args.repeats is None:
        args.repeats = 3 if args.quick else 7
    if args.acceptance_prompts is None:
        args.acceptance_prompts = 1 if args.quick else 2
    if args.acceptance_tokens is None:
        args.acceptance_tokens = 96 if args.quick else 512
    start = time.perf_counter()
    rows = run(args)

    def ratio(value: float) -> str:
        return f"{value:.2f}"

    columns = [Column("step", wrap=True), Column("draft fwd", "draft\nfwd", _count),
               Column("draft bk", "draft\nbk", _count), Column("target fwd", "target\nfwd", _count),
               Column("target bk", "target\nbk", _count),
               Column("verify", fmt=_count), Column("commit", fmt=_count), Column("total", fmt=_count),
               Column("total - draft fwd", "own", _count), Column("x chain (ops)", "own /\nchain", ratio),
               Column("x deep chain (ops)", "own /\ndeep", ratio), Column("x chain (CPU s/step)", "s /\nchain", ratio),
               Column("host reads", "host\nreads", _count)]
    print(format_table(rows, columns, title=f"Kernels per static-path step (aten operations counted on the CPU); "
                                              f"demo pair, {args.max_new_tokens} new tokens, batch 1, greedy"))
    print(f"own: every kernel but the draft forwards'; own / chain, own / deep: against the chain of {args.gamma} "
          f"and of {args.nodes - 1} drafts of the same drafter; s / chain: seconds per step (the static "
          f"path's phase clocks) against the chain of {args.gamma}, medians of {args.repeats} generations, "
          "interleaved")
    if args.acceptance_prompts:
        table = acceptance(args)
        print()
        print(format_table(table, ["method", Column("tokens per step", "tokens /\nstep", ratio),
                                   Column("by prompt", wrap=True), Column("depth", fmt=_count)],
                           title=f"Tokens per step, {args.nodes}-node trees: demo pair, {args.acceptance_prompts} "
                                 f"held-out prompts, {args.acceptance_tokens} new tokens, greedy"))
    if args.names:
        for row in rows:
            print(f"\n{row['step']}:")
            for (phase, name), n in sorted(row["by_name"].items(), key=lambda kv: -kv[1]):
                print(f"  {phase:12s} {name:40s} {n:7.1f}")
    print(f"\n({time.perf_counter() - start:.0f} s)")
