"""mmencode: vision-encoder embeddings for multimodal LLM serving.

The installed package. The repository keeps its three top-level folders (``app/``, ``models/``,
``schemas/``); pyproject.toml installs them as ``mmencode.app``, ``mmencode.models`` and
``mmencode.schemas``, so the distribution has one top-level name and never an ``app`` or ``models`` that
could shadow a user's own.
"""

__version__ = "0.1.0"  # the one source: pyproject.toml reads it

__all__ = ["__version__"]
