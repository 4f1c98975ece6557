"""The Hugging Face model layer: facts about a causal LM (where its inputs go, its vocabulary,
its sliding window), one forward call with an explicit cache, and the KV-cache operations the
engine and the drafters share (crop, row selection, per-row column gather).

Nothing here knows about drafting or verification."""

from specdecode.models.facts import (
    accepts_logits_to_keep,
    decoder_layers,
    forward,
    input_device,
    sliding_window,
    vocab_rows,
)
from specdecode.models.kv_cache import crop, gather_columns, new_cache, select_rows

__all__ = [
    "accepts_logits_to_keep",
    "crop",
    "decoder_layers",
    "forward",
    "gather_columns",
    "input_device",
    "new_cache",
    "select_rows",
    "sliding_window",
    "vocab_rows",
]
