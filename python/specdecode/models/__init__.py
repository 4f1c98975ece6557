"""The Hugging Face model layer: facts about a causal LM (where its inputs go, its vocabulary,
its decoder layers, the masks of each layer type), how a cache is handed to a model and read back
(``cache=`` or ``past_key_values=``, per model class), one forward call with an explicit cache, the KV-cache
operations the engine and the drafters share (crop, row selection, per-row column gather), and
a view of a model that runs a subset of its decoder layers on the same weights.

Nothing here knows about drafting or verification."""

from specdecode.models.cache_io import cache_keyword, cache_kwargs, returned_cache
from specdecode.models.facts import (
    accepts_logits_to_keep,
    check_feature_layers,
    decoder_layers,
    decoder_layers_path,
    forward,
    forward_with_features,
    full_tensor,
    input_device,
    local_tensor,
    unloaded_parameters,
    vocab_rows,
)
from specdecode.models.kv_cache import crop, gather_columns, new_cache, select_rows
from specdecode.models.layer_view import layer_subset_view

__all__ = [
    "accepts_logits_to_keep",
    "cache_keyword",
    "cache_kwargs",
    "check_feature_layers",
    "crop",
    "decoder_layers",
    "decoder_layers_path",
    "forward",
    "forward_with_features",
    "full_tensor",
    "gather_columns",
    "input_device",
    "layer_subset_view",
    "local_tensor",
    "new_cache",
    "returned_cache",
    "select_rows",
    "unloaded_parameters",
    "vocab_rows",
]
