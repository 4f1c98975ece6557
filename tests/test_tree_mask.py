"""``tree_attention_mask`` (compiled op) and :class:`TokenTree`.

The op is compared with the loop reference (``specdecode.trees.reference``) on random trees:
odd sizes, ragged rows with garbage in the padding slots, prefix masks with pad holes in every
accepted dtype, W = 0, and N above 32 (several packed words). Structural facts are checked on
their own: a chain's tree mask is the causal mask and its positions are the chain path's, the
packed bits are the bool mask, the links enumerate every node's children in index order,
padding nodes see only themselves and nobody sees them. Bad input raises ValueError /
TypeError naming the argument, through the wrapper and through direct op calls (in a
subprocess too, to prove nothing crashes). The CUDA kernel, where a GPU exists, equals the CPU.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

import specdecode
import tree_stat_utils as tu
from specdecode.trees import MAX_TREE_NODES, TokenTree, TreeMasks, tree_attention_mask
from specdecode.trees.reference import children_lists, tree_attention_mask_reference

OPS = torch.ops.specdecode


def _prefix(B: int, W: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """0/1 prefix masks with left padding and holes."""
    mask = (torch.rand(B, W, generator=gen) < 0.8).long()
    if W > 0:
        lead = torch.randint(0, W + 1, (B,), generator=gen)
        mask[torch.arange(W)[None, :] < lead[:, None]] = 0
    return mask.to(dtype)


def _assert_masks_equal(got: TreeMasks, want: TreeMasks, what: str) -> None:
    for name, a, b in zip(TreeMasks._fields, got, want):
        assert a.dtype == b.dtype, f"{what}: {name} dtype {a.dtype} vs {b.dtype}"
        assert torch.equal(a.cpu(), b.cpu()), f"{what}: {name} differs from the reference"


SIZES = [(1, 1, 0), (1, 2, 3), (3, 7, 5), (17, 33, 11), (4, 64, 0), (2, 100, 9), (5, 13, 1)]


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("B,N,W", SIZES, ids=lambda v: str(v))
def test_mask_equals_reference(B, N, W, dtype):
    """Every output of the op equals the loop reference on random ragged trees."""
    gen = torch.Generator().manual_seed(B * 1000 + N * 10 + W)
    tree = tu.random_trees(B, N, gen, ragged=True)
    prefix = _prefix(B, W, dtype, gen)
    root = torch.randint(0, 50, (B,), generator=gen)
    got = tree_attention_mask(tree, prefix, root)
    want = tree_attention_mask_reference(tree.parents, tree.num_nodes, prefix, root)
    _assert_masks_equal(got, want, f"B={B} N={N} W={W} {dtype}")
    assert got.attention_mask.shape == (B, 1, N, W + N)
    assert got.packed_tree_mask.shape == (B, N, (N + 31) // 32)
    assert torch.equal(got.depth, tree.depth), "TokenTree.depth disagrees with the op"


def test_chain_mask_is_causal_and_positions_match_the_chain_path():
    """A chain of k drafts: the tree mask is lower-triangular (causal), the positions are the
    chain step's (root position + 0..k), the links are the chain, and ragged rows pad."""
    gen = torch.Generator().manual_seed(0)
    B, k, W = 3, 6, 8
    drafts = torch.randint(0, 100, (B, k), generator=gen)
    n = torch.tensor([6, 2, 0])
    tree = TokenTree.chain(torch.tensor([1, 2, 3]), drafts, n)
    prefix = _prefix(B, W, torch.int64, gen)
    masks = tree_attention_mask(tree, prefix)
    real_tokens = prefix.sum(1)
    causal = torch.tril(torch.ones(k + 1, k + 1, dtype=torch.bool))
    for b in range(B):
        m = int(n[b]) + 1
        assert torch.equal(masks.tree_mask[b, :m, :m], causal[:m, :m])
        assert torch.equal(masks.positions[b, :m], real_tokens[b] + torch.arange(m))
        assert torch.equal(masks.positions[b, m:], real_tokens[b].expand(k + 1 - m))
        assert torch.equal(masks.attention_mask[b, 0, :m, :W], (prefix[b] != 0).expand(m, W))
        assert masks.first_child[b, :m - 1].tolist() == list(range(1, m))
        assert int(masks.first_child[b, m - 1]) == -1
        assert bool((masks.next_sibling[b] == -1).all())


def test_packed_bits_and_links_describe_the_tree():
    """Unpacking the int32 words gives the bool tree mask; following first_child/next_sibling
    gives every node's children in index order, each real non-root node exactly once."""
    gen = torch.Generator().manual_seed(1)
    tree = tu.random_trees(9, 77, gen, ragged=True)
    masks = tree_attention_mask(tree, torch.ones(9, 4, dtype=torch.bool))
    words = masks.packed_tree_mask.long() & 0xFFFFFFFF
    bits = (words[..., :, None] >> torch.arange(32)) & 1  # [B, N, words, 32]
    unpacked = bits.flatten(-2)[..., :77].bool()
    assert torch.equal(unpacked, masks.tree_mask)
    for b in range(9):
        n = int(tree.num_nodes[b])
        expected = children_lists(tree.parents[b].tolist(), n)
        for v in range(77):
            kids, c = [], int(masks.first_child[b, v])
            while c >= 0:
                kids.append(c)
                c = int(masks.next_sibling[b, c])
            assert kids == (expected[v] if v < n else []), f"row {b} node {v}"


def test_padding_nodes_attend_to_themselves_only():
    """A padding slot's query row has exactly one True (its own tree column), so attention
    never sees an all-masked row; no real node attends to a padding slot."""
    gen = torch.Generator().manual_seed(2)
    B, N, W = 6, 10, 5
    tree = tu.random_trees(B, N, gen, ragged=True)
    masks = tree_attention_mask(tree, _prefix(B, W, torch.bool, gen))
    attention = masks.attention_mask[:, 0]
    assert bool((attention.sum(-1) >= 1).all()), "an all-masked query row"
    for b in range(B):
        n = int(tree.num_nodes[b])
        for i in range(n, N):
            row = torch.zeros(W + N, dtype=torch.bool)
            row[W + i] = True
            assert torch.equal(attention[b, i], row)
        assert not bool(attention[b, :n, W + n:].any()), "a real node attends to padding"


def test_default_root_positions_and_additive_mask():
    """root_positions defaults to the number of real prefix tokens; the additive mask is 0 /
    the dtype's minimum; a parents tensor works in place of a TokenTree."""
    prefix = torch.tensor([[0, 0, 1, 1, 1], [1, 0, 1, 0, 1]])
    parents = torch.tensor([[-1, 0, 0, 1], [-1, 0, 1, 2]])
    masks = tree_attention_mask(parents, prefix)
    assert masks.positions.tolist() == [[3, 4, 4, 5], [3, 4, 5, 6]]
    additive = masks.additive_mask(torch.float16)
    assert additive.dtype == torch.float16
    assert torch.equal(additive == 0, masks.attention_mask)
    assert bool((additive[~masks.attention_mask] == torch.finfo(torch.float16).min).all())
    ragged = tree_attention_mask(parents, prefix, num_nodes=torch.tensor([2, 4]))
    assert ragged.depth.tolist() == [[0, 1, 0, 0], [0, 1, 2, 3]]


def test_empty_batch_and_empty_prefix():
    """B = 0 gives empty outputs of the right shapes; W = 0 gives the tree mask alone."""
    out = tree_attention_mask(torch.empty(0, 5, dtype=torch.int64), torch.empty(0, 3, dtype=torch.bool))
    assert out.attention_mask.shape == (0, 1, 5, 8) and out.packed_tree_mask.shape == (0, 5, 1)
    tree = TokenTree.chain(torch.tensor([1]), torch.tensor([[2, 3]]))
    out = tree_attention_mask(tree, torch.empty(1, 0, dtype=torch.int64))
    assert torch.equal(out.attention_mask[:, 0], out.tree_mask) and out.positions.tolist() == [[0, 1, 2]]


# ------------------------------------------------------------------------------ TokenTree


def test_token_tree_properties_and_chain():
    tree = TokenTree.chain(torch.tensor([9, 8]), torch.tensor([[1, 2, 3], [4, 5, 6]]), torch.tensor([3, 1]))
    assert (tree.batch_size, tree.max_nodes, tree.max_depth) == (2, 4, 3)
    assert tree.tokens.tolist() == [[9, 1, 2, 3], [8, 4, 5, 6]]
    assert tree.num_nodes.tolist() == [4, 2]
    assert tree.depth.tolist() == [[0, 1, 2, 3], [0, 1, 0, 0]]
    tree.validate()
    gen = torch.Generator().manual_seed(3)
    deep = tu.random_trees(5, 300, gen, ragged=True, chain_prob=0.9)
    assert torch.equal(deep.depth, tree_attention_mask(deep, torch.ones(5, 0, dtype=torch.bool)).depth)


@pytest.mark.parametrize("make,exc,match", [
    (lambda: TokenTree([[1]], torch.tensor([[-1]]), torch.tensor([1])), TypeError, "tokens"),
    (lambda: TokenTree(torch.tensor([[1]]), torch.tensor([[-1]], dtype=torch.int32), torch.tensor([1])), TypeError, "parents"),
    (lambda: TokenTree(torch.tensor([[1, 2]]), torch.tensor([[-1]]), torch.tensor([1])), ValueError, "tokens"),
    (lambda: TokenTree(torch.tensor([[1]]), torch.tensor([[-1]]), torch.tensor([1, 1])), ValueError, "num_nodes"),
    (lambda: TokenTree(torch.tensor([[1]]), torch.tensor([-1]), torch.tensor([1])), ValueError, "parents"),
    (lambda: TokenTree(torch.empty(1, 0, dtype=torch.int64), torch.empty(1, 0, dtype=torch.int64), torch.tensor([1])),
     ValueError, "parents"),
    (lambda: TokenTree(torch.tensor([[1]], device="meta"), torch.tensor([[-1]]), torch.tensor([1])), ValueError, "tokens"),
    (lambda: TokenTree.chain(torch.tensor([1, 2]), torch.tensor([[1, 2]])), ValueError, "root_tokens"),
    (lambda: TokenTree.chain(torch.tensor([1]), torch.tensor([[1, 2]]), torch.tensor([1.0])), TypeError, "num_draft_tokens"),
])
def test_token_tree_construction_errors(make, exc, match):
    with pytest.raises(exc, match=match):
        make()


@pytest.mark.parametrize("parents,num_nodes,match", [
    ([[-1, 0, 1]], [0], "num_nodes"),
    ([[-1, 0, 1]], [4], "num_nodes"),
    ([[0, 0, 1]], [3], "parents"),
    ([[-1, 1, 1]], [3], "parents"),
    ([[-1, 0, 2]], [3], "parents"),
    ([[-1, 0, -1]], [3], "parents"),
    ([[-1, 0, 5]], [3], "parents"),
])
def test_bad_trees_raise(parents, num_nodes, match):
    """TokenTree.validate, the wrapper and the direct op call all raise ValueError naming the
    argument for a tree that is not a tree."""
    parents, num_nodes = torch.tensor(parents), torch.tensor(num_nodes)
    tree = TokenTree(torch.zeros_like(parents), parents, num_nodes)
    with pytest.raises(ValueError, match=match):
        tree.validate()
    with pytest.raises(ValueError, match=match):
        tree_attention_mask(tree, torch.ones(1, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match=match):
        OPS.tree_attention_mask(parents, num_nodes, torch.ones(1, 2, dtype=torch.bool), torch.tensor([2]))


def test_padding_slots_are_not_checked():
    """Values in padding slots (beyond num_nodes) may be anything."""
    parents = torch.tensor([[-1, 0, 7, -5, 99]])
    out = tree_attention_mask(parents, torch.ones(1, 1, dtype=torch.bool), num_nodes=torch.tensor([2]))
    assert out.depth.tolist() == [[0, 1, 0, 0, 0]]


_GOOD = {"parents": torch.tensor([[-1, 0, 0]]), "num_nodes": torch.tensor([3]),
         "prefix_mask": torch.tensor([[1, 1]]), "root_positions": torch.tensor([2])}

MASK_CASES = [
    ("prefix_value_2", {"prefix_mask": torch.tensor([[1, 2]])}, ValueError, "prefix_mask"),
    ("prefix_negative", {"prefix_mask": torch.tensor([[-1, 1]], dtype=torch.int32)}, ValueError, "prefix_mask"),
    ("prefix_float", {"prefix_mask": torch.tensor([[1.0, 1.0]])}, TypeError, "prefix_mask"),
    ("prefix_1d", {"prefix_mask": torch.tensor([1, 1])}, ValueError, "prefix_mask"),
    ("prefix_batch", {"prefix_mask": torch.ones(2, 2, dtype=torch.bool)}, ValueError, "prefix_mask"),
    ("prefix_meta", {"prefix_mask": torch.ones(1, 2, dtype=torch.bool, device="meta")}, ValueError, "prefix_mask"),
    ("root_negative", {"root_positions": torch.tensor([-1])}, ValueError, "root_positions"),
    ("root_int32", {"root_positions": torch.tensor([2], dtype=torch.int32)}, TypeError, "root_positions"),
    ("root_shape", {"root_positions": torch.tensor([2, 2])}, ValueError, "root_positions"),
    ("parents_int32", {"parents": torch.tensor([[-1, 0, 0]], dtype=torch.int32)}, TypeError, "parents"),
    ("parents_1d", {"parents": torch.tensor([-1, 0, 0])}, ValueError, "parents"),
    ("parents_too_many", {"parents": torch.full((1, MAX_TREE_NODES + 1), -1)}, ValueError, "parents"),
    ("num_nodes_shape", {"num_nodes": torch.tensor([3, 3])}, ValueError, "num_nodes"),
    ("num_nodes_float", {"num_nodes": torch.tensor([3.0])}, TypeError, "num_nodes"),
    ("num_nodes_meta", {"num_nodes": torch.tensor([3], device="meta")}, ValueError, "num_nodes"),
]


@pytest.mark.parametrize("change,exc,match", [c[1:] for c in MASK_CASES], ids=[c[0] for c in MASK_CASES])
def test_mask_bad_input(change, exc, match):
    """Wrapper and direct op call raise ValueError / TypeError naming the argument."""
    args = {**_GOOD, **change}
    with pytest.raises(exc, match=match):
        tree_attention_mask(args["parents"], args["prefix_mask"], args["root_positions"], num_nodes=args["num_nodes"])
    with pytest.raises(exc, match=match):
        OPS.tree_attention_mask(args["parents"], args["num_nodes"], args["prefix_mask"], args["root_positions"])


def test_direct_op_calls_never_crash():
    """Garbage passed straight to torch.ops.specdecode.tree_attention_mask raises in a child
    process instead of killing it."""
    code = textwrap.dedent("""
        import torch, specdecode
        op = torch.ops.specdecode.tree_attention_mask
        cases = [
            (torch.tensor([[-1, 5, 2**40]]), torch.tensor([3]), torch.ones(1, 3, dtype=torch.bool), torch.tensor([0])),
            (torch.tensor([[-1, 0]]), torch.tensor([-7]), torch.ones(1, 0, dtype=torch.bool), torch.tensor([0])),
            (torch.tensor([[-1, 0]]), torch.tensor([2]), torch.ones(1, 0, dtype=torch.bool), torch.tensor([-3])),
            (torch.empty(0, 0, dtype=torch.int64), torch.empty(0, dtype=torch.int64), torch.ones(0, 2), torch.empty(0)),
            (torch.tensor([[-1, -1], [0, 0]]).t(), torch.tensor([2, 2]), torch.ones(2, 1, dtype=torch.uint8), torch.tensor([0, 0])),
        ]
        raised = 0
        for args in cases:
            try:
                op(*args)
            except (ValueError, TypeError, RuntimeError):
                raised += 1
        print("raised", raised)
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "raised 4" in result.stdout, result.stdout


@pytest.mark.cuda
def test_cuda_mask_equals_cpu():
    """The CUDA kernel gives the CPU op's outputs (random ragged trees, every prefix dtype,
    deep chains, several packed words) and raises the same ValueError on bad trees."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    gen = torch.Generator().manual_seed(5)
    for (B, N, W), dtype in zip(SIZES + [(3, 513, 40)], [torch.bool, torch.uint8, torch.int32, torch.int64] * 2):
        tree = tu.random_trees(B, N, gen, ragged=True, chain_prob=0.5)
        prefix = _prefix(B, W, dtype, gen)
        root = torch.randint(0, 50, (B,), generator=gen)
        cpu = tree_attention_mask(tree, prefix, root)
        gpu = tree_attention_mask(tree.to("cuda"), prefix.cuda(), root.cuda())
        _assert_masks_equal(gpu, cpu, f"cuda B={B} N={N} W={W}")
    with pytest.raises(ValueError, match="parents"):
        tree_attention_mask(torch.tensor([[-1, 2, 0]], device="cuda"), torch.ones(1, 1, dtype=torch.bool, device="cuda"))


def test_docstring_examples():
    """The examples in the docstrings of specdecode.trees run and print what they show."""
    import doctest

    import specdecode.trees
    from specdecode.trees import mask, rules, tree, verify

    for module in (specdecode.trees, tree, mask, verify, rules):
        result = doctest.testmod(module, extraglobs={"torch": torch, "specdecode": specdecode})
        assert result.attempted > 0 and result.failed == 0, f"{module.__name__}: {result}"
