"""How many cache columns a chain step of the static decode path attends over.

A static cache holds ``capacity`` columns per row, but after ``step`` steps no row can have
reached past :func:`visible_columns` of them, so the target's score forward reads only those
(``ColumnCache.visible``: the cache hands the layers the first ``width`` columns, the mask is
``width`` wide). A CUDA graph fixes the shapes it recorded, so the graphed path cannot follow
the bound column by column: it rounds the bound up to a *bucket* (:func:`attended_columns`) and
records one graph per bucket reached (:class:`~specdecode.engine.graphs.StepProgram`'s
variants). The static path, which the host runs step by step, attends over the same bucketed
widths, so the CPU tests exercise exactly the widths the graphed path records.

The buckets are multiples of :data:`BUCKET_COLUMNS` (64) columns, at most :data:`MAX_BUCKETS`
(8) per layout: past ``8 * 64 = 512`` columns of capacity the multiple grows (128, 192, ...),
the last bucket is the capacity itself. Why these: a GPU attention kernel reads keys in blocks
of 64 or 128, so a width that is not a multiple of 64 saves next to nothing; each bucket costs
one graph capture the first time a layout reaches it (an eager warm-up step, which is a real
step, then the recording: milliseconds to tens of them), once per layout (kept layouts replay
the bucket's graph). Equal steps waste on average half a bucket per step, a geometric series
(64, 128, 256, ...) a quarter of the width, more when generations are long, which is where the
attention matters. Compiled steps and token trees attend over the whole capacity.
"""

from __future__ import annotations

#: Attended widths are multiples of this many columns (a GPU attention kernel's key block).
BUCKET_COLUMNS = 64
#: A layout has at most this many attended widths (each is one graph capture on the graphed path).
MAX_BUCKETS = 8


def visible_columns(prompt_width: int, step: int, gamma: int, capacity: int) -> int:
    """The columns a chain step ``step`` (from 0) of the static path can need: every row starts
    at column ``prompt_width - 1``, moves by at most ``gamma + 1`` a step and feeds ``gamma + 1``
    columns, so none reaches column ``prompt_width + step * (gamma + 1) + gamma``; at most the
    whole ``capacity``. The steps attend over this bound rounded up to a bucket
    (:func:`attended_columns`), on the static and the graphed path alike; compiled steps and token
    trees attend over the whole capacity.

    >>> visible_columns(prompt_width=10, step=0, gamma=3, capacity=64)  # columns 9 .. 12 fed
    13
    >>> visible_columns(prompt_width=10, step=20, gamma=3, capacity=64)
    64
    """
    return min(capacity, prompt_width + step * (gamma + 1) + gamma)


def bucket_columns(capacity: int) -> int:
    """The multiple of columns the attended widths of a layout of ``capacity`` columns are
    rounded up to: :data:`BUCKET_COLUMNS`, or the least multiple of it that leaves at most
    :data:`MAX_BUCKETS` widths.

    >>> bucket_columns(512), bucket_columns(513), bucket_columns(2048)
    (64, 128, 256)
    """
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise ValueError(f"capacity: expected an int >= 1, got {capacity!r}")
    per_bucket = -(-capacity // MAX_BUCKETS)
    return -(-per_bucket // BUCKET_COLUMNS) * BUCKET_COLUMNS


def bucketed_width(columns: int, capacity: int) -> int:
    """``columns`` rounded up to the layout's next bucket (:func:`bucket_columns`), at most the
    ``capacity``.

    >>> bucketed_width(13, 200), bucketed_width(64, 200), bucketed_width(65, 200), bucketed_width(199, 200)
    (64, 64, 128, 200)
    """
    multiple = bucket_columns(capacity)
    return min(capacity, -(-columns // multiple) * multiple)


def attended_columns(prompt_width: int, step: int, gamma: int, capacity: int) -> int:
    """The width a chain step ``step`` attends over: :func:`visible_columns` rounded up to a
    bucket (:func:`bucketed_width`). The graphed path records one graph per width.

    >>> [attended_columns(prompt_width=40, step=s, gamma=3, capacity=200) for s in (0, 5, 6, 40)]
    [64, 64, 128, 200]
    """
    return bucketed_width(visible_columns(prompt_width, step, gamma, capacity), capacity)


def bucket_widths(capacity: int) -> list[int]:
    """Every width a layout of ``capacity`` columns can attend over, in increasing order (at most
    :data:`MAX_BUCKETS`).

    >>> bucket_widths(200), len(bucket_widths(4096))
    ([64, 128, 192, 200], 8)
    """
    multiple = bucket_columns(capacity)
    return [min(capacity, k * multiple) for k in range(1, -(-capacity // multiple) + 1)]
