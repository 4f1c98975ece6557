"""What a model class's own source says: for the few facts about Hugging Face models that no
config field tells and no forward can probe cheaply (whether a model builds sliding-window masks
itself, whether its attention branches on the name of its implementation)."""

from __future__ import annotations

import inspect
import sys
import weakref

# (text) -> model class -> whether a module along the class's MRO mentions it. Keyed by the class
# itself (weakly: a class defined in a notebook cell goes with it), never by an id().
_MENTIONS: dict[str, "weakref.WeakKeyDictionary[type, bool]"] = {}


def module_mentions(cls: type, text: str) -> bool:
    """Whether the source of a module that defines ``cls`` or one of its bases contains ``text``
    (False where a module's source cannot be read).

    Example:
        >>> module_mentions(LlamaForCausalLM, "create_sliding_window_causal_mask")  # doctest: +SKIP
        False
    """
    table = _MENTIONS.setdefault(text, weakref.WeakKeyDictionary())
    answer = table.get(cls)
    if answer is None:
        answer = False
        for klass in cls.__mro__:
            module = sys.modules.get(klass.__module__)
            try:
                source = inspect.getsource(module) if module is not None else ""
            except (OSError, TypeError):
                continue
            if text in source:
                answer = True
                break
        table[cls] = answer
    return answer
