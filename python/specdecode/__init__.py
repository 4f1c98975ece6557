"""specdecode: speculative decoding for Hugging Face models, with every verification rule
implemented in compiled code and proven lossless by test.

>>> import torch, specdecode
>>> p = torch.softmax(torch.randn(1, 4, 50), -1)            # target p_1..p_4
>>> q = torch.softmax(torch.randn(1, 3, 50), -1)            # draft q_1..q_3
>>> x = torch.multinomial(q[0], 1).T                        # drafted tokens [1, 3]
>>> out = specdecode.verify(p, q, x, rule="block")
>>> out.tokens, out.accepted_len                            # [1, 4] (-1 padded), [1]
"""

from typing import TYPE_CHECKING

from specdecode import _meta  # noqa: F401  (fake kernels for torch.compile)
from specdecode import cpu  # noqa: F401  (the CPU fast path: specdecode.cpu.accelerate)
from specdecode._ops import build_info
from specdecode.analysis import (
    acceptance_rate,
    expected_speedup,
    expected_tokens_per_call,
    optimal_num_draft_tokens,
)
from specdecode.demo import load_demo_pair
from specdecode.drafters import (
    Drafter,
    JacobiDrafter,
    LayerSkipDrafter,
    LookaheadDrafter,
    ModelDrafter,
    NgramDrafter,
    Proposal,
    SuffixDrafter,
    TokenCorpus,
    TokenizerBridgeDrafter,
)
from specdecode.engine import DraftSchedule, SpeculativeStats
from specdecode.integrations.hf import SpeculativeOutput, check_compatibility, custom_generate, generate
from specdecode.pairs import load_pair
from specdecode.reference import VerifyOutput
from specdecode.rules import RuleInfo, list_rules, register_rule, unregister_rule
from specdecode.sampling import SamplingParams
from specdecode.trees import TokenTree, register_tree_rule, tree_attention_mask, unregister_tree_rule, verify_tree
from specdecode.verify import verify, verify_logits

__version__ = "0.1.0"


if TYPE_CHECKING:  # names in annotations only
    import os

    import torch


def load_drafter(path: "str | os.PathLike[str]", target: "torch.nn.Module") -> "torch.nn.Module | Drafter":
    """The drafter trained by ``python -m specdecode train`` in folder ``path``, checked against
    ``target`` (:func:`specdecode.training.load_drafter`; the training kit is imported lazily).

    Example:
        >>> target, _, tok = specdecode.load_demo_pair()  # doctest: +SKIP
        >>> draft = specdecode.load_drafter("runs/demo-draft", target)  # doctest: +SKIP
        >>> specdecode.generate(target, draft, tok("def f(", return_tensors="pt").input_ids)  # doctest: +SKIP
    """
    from specdecode.training.artifacts import load_drafter as load

    return load(path, target)


__all__ = [
    "DraftSchedule",
    "Drafter",
    "JacobiDrafter",
    "LayerSkipDrafter",
    "LookaheadDrafter",
    "ModelDrafter",
    "NgramDrafter",
    "Proposal",
    "SamplingParams",
    "SuffixDrafter",
    "TokenCorpus",
    "TokenizerBridgeDrafter",
    "load_demo_pair",
    "load_pair",
    "load_drafter",
    "RuleInfo",
    "SpeculativeOutput",
    "SpeculativeStats",
    "TokenTree",
    "check_compatibility",
    "custom_generate",
    "generate",
    "VerifyOutput",
    "acceptance_rate",
    "build_info",
    "expected_speedup",
    "expected_tokens_per_call",
    "list_rules",
    "optimal_num_draft_tokens",
    "register_rule",
    "register_tree_rule",
    "tree_attention_mask",
    "unregister_rule",
    "unregister_tree_rule",
    "verify",
    "verify_logits",
    "verify_tree",
]
