"""mmencode: vision-encoder embeddings for multimodal LLM serving.

The installed package. The repository keeps its three top-level folders (``app/``, ``models/``,
``schemas/``); this folder links them in, so the distribution installs one top-level name and never an
``app`` or ``models`` that could shadow a user's own.
"""

from mmencode.app import __version__

__all__ = ["__version__"]
