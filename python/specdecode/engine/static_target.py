"""The target alone on the static decode path: :class:`TargetOnly`, the "drafter" of plain
decoding (the baseline every speculative gain is measured against, and the training data
stage's continuations), and the training labels its steps can record on the way.

Labels from the decode steps
----------------------------
A drafter is trained on the target's own continuations, labelled with the target's top-``k``
log-probabilities at every position and (feature drafters) its hidden states there
(:class:`specdecode.training.data.Example`). The decode steps that *make* a continuation
already compute both: each step scores the pending column (the first step the last prompt
token, step ``i + 1`` new token ``i``), whose logits give the distribution of the next token
and whose forward gives the hidden states there. ``TargetOnly(feature_layers=..., label_top_k=k)`` keeps them:

- the features through the static path's feature buffer
  (:mod:`specdecode.engine.static_features`: the prefill writes the prompt's columns, each
  step its pending column), as for a feature drafter;
- the labels through one more phase after the score phase (:func:`label_phase`): the
  ``log_softmax`` of the step's target logits (float32), its top ``k`` written at the pending
  column of each row, in two buffers laid out on the cache's columns.

So no second forward over the finished sequences is needed. After a generation, row ``b``'s
scored columns are ``[start[b], lengths[b]]``: a finished row's length pointer stays on the
column its last step scored (the token before its last new token, whose own distribution was
never computed). :meth:`TargetOnly.labelled_rows` reads them back: the prompt and all new tokens
but the last, every position with its features, and labels from the last prompt position on
(the positions before it carry zeros: the training loss and acceptance estimates start there).

Finished rows keep being scored, masked, at the same column with the same context, so what is
written there again is the same up to rounding (on the static path a later step's attention
may span more, masked, columns).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

__all__ = ["TargetOnly", "label_buffers", "label_phase", "record_labels"]

_LOGP, _IDS = "labels.top_logp", "labels.top_ids"


class TargetOnly:
    """The "drafter" of plain decoding on the static path: no drafts; each step is one target
    forward and one sampled token (``specdecode.generate(target, None, ...)``).

    ``feature_layers``: the target hidden states to keep at every scored column (indices into
    ``hidden_states``, checked by the engine); ``label_top_k``: record the top ``k``
    log-probabilities of every step (see the module docstring). Both None: plain decoding.

    Example (what :func:`specdecode.training.continuations.continue_and_label` does)::

        labeller = TargetOnly(feature_layers=(-1,), label_top_k=64)
        StaticEngine(target, labeller, engine_settings).generate(input_ids, attention_mask)
        rows = labeller.labelled_rows(len(prompts))  # dicts of Example fields, on the CPU
    """

    name = "none"

    def __init__(self, feature_layers: tuple[int, ...] | None = None, label_top_k: int | None = None) -> None:
        if label_top_k is not None and (isinstance(label_top_k, bool) or not isinstance(label_top_k, int)
                                        or label_top_k < 1):
            raise ValueError(f"label_top_k: expected an int >= 1 or None, got {label_top_k!r}")
        self.feature_layers = None if feature_layers is None else tuple(feature_layers)
        self.label_top_k = label_top_k
        self._state: Any = None  # the layout's state of the last generation (read by labelled_rows)

    def static_key(self) -> tuple:
        return ("none", self.label_top_k)

    def static_prefill(self, state: Any, num_tokens: int) -> None:
        self._state = state if self.label_top_k is not None else None

    def static_propose(self, state: Any, num_tokens: int) -> tuple[Tensor, Tensor]:  # pragma: no cover
        raise RuntimeError("TargetOnly proposes nothing")

    def labelled_rows(self, num_rows: int) -> list[dict[str, Tensor | int | None]]:
        """The first ``num_rows`` rows of the last generation as training rows (the fields of
        :class:`specdecode.training.data.Example`), on the CPU: ``input_ids`` (the prompt and
        every new token but the last), ``top_logp`` (float16) / ``top_ids`` (int32) (zeros before
        ``start``), ``features`` (float16, or None without ``feature_layers``) and ``start``
        (the last prompt position).

        Shape:
            per row: input_ids ``[t]``; top_logp, top_ids ``[t, k]``; features ``[t, F]``.
        """
        state = self._state
        if isinstance(num_rows, bool) or not isinstance(num_rows, int) or num_rows < 0:
            raise ValueError(f"num_rows: expected an int >= 0, got {num_rows!r}")
        if state is not None and num_rows > state.batch_size:
            raise ValueError(f"num_rows: the generation had {state.batch_size} rows, asked for {num_rows}")
        if state is None:
            raise RuntimeError("labelled_rows: no labelled generation ran "
                               "(TargetOnly(label_top_k=k) on the static path)")
        first_label = state.prompt_width - 1  # the last prompt token's column
        starts, lengths = state.start.tolist(), state.lengths.tolist()
        tokens = state.tokens.cpu()
        logp, ids = label_buffers(state, self.label_top_k)  # halved on the device, then copied
        logp, ids = logp.to(torch.float16).cpu(), ids.to(torch.int32).cpu()
        features = None if state.features is None else state.features.to(torch.float16).cpu()
        rows = []
        for b in range(num_rows):
            lo, hi = starts[b], lengths[b] + 1
            top_logp, top_ids = logp[b, lo:hi].clone(), ids[b, lo:hi].clone()
            top_logp[: first_label - lo] = 0
            top_ids[: first_label - lo] = 0
            rows.append({"input_ids": tokens[b, lo:hi].clone(), "top_logp": top_logp, "top_ids": top_ids,
                         "start": first_label - lo,
                         "features": None if features is None else features[b, lo:hi].clone()})
        return rows


def label_buffers(state: Any, top_k: int) -> tuple[Tensor, Tensor]:
    """The layout's label buffers (log-probabilities, token ids), made on first use (zeros).

    Shape: ``[B, capacity, min(top_k, vocab_size)]`` float32 and int64.
    """
    shape = (state.batch_size, state.capacity, min(top_k, state.vocab_size))
    return (state.buffer(_LOGP, lambda: torch.zeros(shape, dtype=torch.float32, device=state.device)),
            state.buffer(_IDS, lambda: torch.zeros(shape, dtype=torch.long, device=state.device)))


def record_labels(state: Any, logits: Tensor, top_k: int) -> None:
    """Write the top ``top_k`` log-probabilities of ``logits`` (the target's, at each row's
    pending column) and their ids at that column (``state.lengths``) of :func:`label_buffers`.

    Shape:
        logits: ``[B, V]`` with ``V`` the state's ``vocab_size``.
    """
    logp_buffer, ids_buffer = label_buffers(state, top_k)
    B, k = logits.shape[0], logp_buffer.shape[-1]
    values, ids = torch.log_softmax(logits.float(), -1).topk(k, -1)
    columns = state.lengths[:, None, None].expand(B, 1, k)
    logp_buffer.scatter_(1, columns, values[:, None])
    ids_buffer.scatter_(1, columns, ids[:, None])


def label_phase(state: Any, scratch: Any, top_k: int) -> Callable[[], None]:
    """The step phase that records the labels of the score phase's logits, run between the
    score and the commit (the length pointers still on the scored column).

    Shape:
        scratch.target_logits: ``[B, 1, V]`` (a chain step of the target alone).
    """

    def labels() -> None:
        record_labels(state, scratch.target_logits[:, 0], top_k)

    return labels
