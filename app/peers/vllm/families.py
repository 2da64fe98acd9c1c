"""What vLLM (0.32-0.34) takes of each family, where it differs from family to family."""

from __future__ import annotations

__all__ = ["EMBEDS_REFUSED"]

# Families whose rows vLLM refuses as an ``image_embeds`` content part (it answers 400): they reach it only
# through its encoder-cache connector (the front door's ``ec`` transport).
EMBEDS_REFUSED: frozenset[str] = frozenset({"gemma3", "idefics3", "smolvlm", "mistral3"})
