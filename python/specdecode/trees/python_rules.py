"""Row functions of the tree rules written over whole trees or node arrays: traversal
verification, GBV, SpecTr and SpecHub. All four run in the compiled op
(csrc/kernels/tree_traversal.h, tree_gbv.h, tree_transport.h); their row functions stay here as
the reference the tests compare the op against, decision for decision, with
:func:`verify_tree_python` running them over a batch. A rule listed in :data:`PYTHON_ONLY` (none
now) would have no kernel: :func:`specdecode.verify_tree` would send its name here.

Each rule is a *row function* ``row(p_rows, q_rows, tokens, parents, num_nodes, chooser)`` that
returns ``(path node indices from the root, emitted tokens)``, drawing every random answer from
the chooser. With :class:`~specdecode.trees.reference.CoinChooser` the coins follow the
compiled op's layout (column ``c > 0`` is node c's coin, column 0 the emitted token's), so the
same ``uniforms`` drive every rule. The probabilities are the compiled ops' processed
distributions (:func:`specdecode.sampling.processed_probs`), so the rules read exactly the
``p`` and ``q`` the drafts were drawn from.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import torch
from torch import Tensor

from specdecode.sampling import SamplingParams, processed_probs
from specdecode.trees.multipath import gbv_row
from specdecode.trees.output import TreeVerifyOutput
from specdecode.trees.reference import CoinChooser, children_lists, verify_tree_row
from specdecode.trees.transport import spechub_node, spectr_node
from specdecode.trees.traversal import traversal_row
from specdecode.trees.tree import TokenTree

RowRule = Callable[..., tuple[list[int], list[int]]]


def _node_rule_row(node_rule) -> RowRule:
    def row(p_rows, q_rows, tokens, parents, num_nodes, chooser):
        return verify_tree_row(node_rule, p_rows, q_rows, tokens, parents, num_nodes, chooser)
    return row


#: Row function (the reference) of every rule above, compiled or not.
ROW_RULES: dict[str, RowRule] = {
    "traversal": partial(traversal_row, replacement=False),
    "traversal_iid": partial(traversal_row, replacement=True),
    "gbv": gbv_row,
    "spectr": _node_rule_row(spectr_node),
    "spechub": _node_rule_row(spechub_node),
}
_DISTINCT_SIBLINGS = ("traversal",)
#: The rules with no compiled kernel (none now): verify_tree runs their row functions.
PYTHON_ONLY: tuple[str, ...] = ()


def _rows(logits: Tensor, sampling: SamplingParams) -> Tensor:
    B, N, V = logits.shape
    return processed_probs(logits.reshape(B * N, V), sampling).view(B, N, V)


def verify_tree_python(target_logits: Tensor, draft_logits: Tensor, tree: TokenTree, *, rule: str,
                       sampling: SamplingParams, uniforms: Tensor) -> TreeVerifyOutput:
    """Run a tree rule's row function over a batch (temperature > 0; the caller handles 0).

    Shape:
        target_logits, draft_logits: ``[B, N, V]``; uniforms: ``[B, N]`` float64 in [0, 1);
        returns :class:`TreeVerifyOutput` trimmed to ``tree.max_depth + 1`` columns.

    Raises ``ValueError`` naming ``tree`` / ``tree_tokens`` for bad trees, node tokens outside
    ``[0, V)``, repeated sibling tokens under ``traversal``, and a shape ``gbv`` cannot verify.
    """
    row_rule = ROW_RULES[rule]
    tree.validate()
    B, N, V = target_logits.shape
    p = _rows(target_logits, sampling).cpu()
    q = _rows(draft_logits, sampling).cpu()
    coins = uniforms.detach().to(torch.float64).cpu()
    width = tree.max_depth + 1
    tokens_out = torch.full((B, width), -1, dtype=torch.int64)
    nodes_out = torch.full((B, width), -1, dtype=torch.int64)
    accepted = torch.zeros(B, dtype=torch.int64)
    all_tokens, all_parents, all_counts = tree.tokens.cpu().tolist(), tree.parents.cpu().tolist(), tree.num_nodes.tolist()
    for b in range(B):
        n = int(all_counts[b])
        tokens, parents = all_tokens[b][:n], all_parents[b][:n]
        bad = [t for t in tokens[1:] if not 0 <= t < V]
        if bad:
            raise ValueError(f"tree_tokens: row {b} has node token {bad[0]} outside [0, V) = [0, {V})")
        if rule in _DISTINCT_SIBLINGS:
            for kids in children_lists(parents, n):
                if len({tokens[c] for c in kids}) != len(kids):
                    raise ValueError(f"tree_tokens: row {b}: two children of one node carry the same token "
                                     f"(rule {rule!r} needs children drawn without replacement)")
        chooser = CoinChooser(coins[b].tolist())
        try:
            nodes, out = row_rule(p[b, :n].tolist(), q[b, :n].tolist(), tokens, parents, n, chooser)
        except ValueError as error:
            raise ValueError(f"{error} (row {b})") from None
        tokens_out[b, : len(out)] = torch.tensor(out)
        nodes_out[b, : len(nodes)] = torch.tensor(nodes)
        accepted[b] = len(nodes) - 1
    device = tree.device
    return TreeVerifyOutput(tokens_out.to(device), accepted.to(device), nodes_out.to(device))


def is_python_rule(name: str) -> bool:
    """Whether tree rule ``name`` runs in Python (no compiled kernel)."""
    return name in PYTHON_ONLY

