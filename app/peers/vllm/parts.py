"""The content part that replaces an image in the request the front door sends to vLLM.

``embeds``: an ``image_embeds`` part carrying the rows (base64 of ``torch.save``, as vLLM's
``ImageEmbeddingMediaIO`` reads it), with the flat ``[t, h, w]`` grid beside them for the families
that need one (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5, GLM-4.1V); the tensor alone otherwise.

``ec``: the rows are in the encoder-cache connector file named by the hash; the part carries what vLLM
needs to count the placeholders: the grid alone (metadata only), or, for families without a grid, the
client's image part itself, which vLLM preprocesses to count them and then takes the rows from the file.

Both carry ``uuid`` = mmencode's content hash: vLLM's ``mm_hash`` for the item, so its encoder cache,
its prefix cache (vllm#21771) and its connector all key the item the same way on every request.
"""

from __future__ import annotations

from typing import Any

import torch

from mmencode.app.engine.types import ItemResult
from mmencode.app.wire.b64 import encode_ascii
from mmencode.app.wire.encodings import torch_save_bytes

__all__ = ["ec_part", "embeds_part"]


def embeds_part(result: ItemResult, dtype: torch.dtype) -> dict[str, Any]:
    rows: Any = encode_ascii(torch_save_bytes(result.rows.to(dtype)))
    grid = result.metadata.get("image_grid_thw")
    payload = rows if grid is None else {"image_embeds": rows, "image_grid_thw": grid}
    return {"type": "image_embeds", "image_embeds": payload, "uuid": result.hash}


def ec_part(result: ItemResult, client_part: dict[str, Any]) -> dict[str, Any]:
    grid = result.metadata.get("image_grid_thw")
    if grid is not None:
        return {"type": "image_embeds", "image_embeds": {"image_grid_thw": grid}, "uuid": result.hash}
    return {**client_part, "uuid": result.hash}
