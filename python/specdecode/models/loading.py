"""Loading local checkpoints without a progress bar per load.

``from_pretrained`` draws a "Loading weights" progress bar for every model, which for the
embedded 13 MB pair (or any local checkpoint loaded in a second) is noise on every demo and
benchmark screen. :func:`quiet_loading` switches Hugging Face's bars off for the duration of a
load and restores the user's setting afterwards.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator


@contextmanager
def quiet_loading() -> Iterator[None]:
    """Within the block, Hugging Face draws no loading progress bars; the previous setting
    (``transformers.utils.logging.is_progress_bar_enabled()``) comes back on exit."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    if was_enabled:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
