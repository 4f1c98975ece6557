"""Thin adapters from other libraries' conventions to the engine (today: Hugging Face)."""
