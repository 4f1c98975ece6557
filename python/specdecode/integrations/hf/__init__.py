"""Hugging Face integration: :func:`generate` (standalone) and :func:`custom_generate` (a
plug-in for ``model.generate``), both thin adapters over :mod:`specdecode.engine`, and
:func:`check_compatibility` for a target / draft pair."""

from specdecode.integrations.hf.compat import check_compatibility
from specdecode.integrations.hf.generate import SpeculativeOutput, generate
from specdecode.integrations.hf.plugin import custom_generate

__all__ = ["SpeculativeOutput", "check_compatibility", "custom_generate", "generate"]
