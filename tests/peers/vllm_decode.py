"""vLLM's side of ``image_embeds``, ``video_embeds`` and ``audio_embeds``, run with the peers venv's Python
(vllm 0.34.0, --no-deps).

Reads a JSON list of base64 payloads (``embedding.data`` of ``pt`` or ``npy`` items) on stdin and
decodes each with ``ImageEmbeddingMediaIO.load_base64`` (``VideoEmbeddingMediaIO``'s with ``video``,
``AudioEmbeddingMediaIO``'s with ``audio``), exactly as vLLM's chat API does for an ``image_embeds``
(``video_embeds``, ``audio_embeds``) content part. Writes the tensors to OUT with ``torch.save``.

usage: python vllm_decode.py OUT [image|video|audio] < payloads.json
"""

from __future__ import annotations

import json
import sys

import torch
from vllm.multimodal.media.audio import AudioEmbeddingMediaIO
from vllm.multimodal.media.image import ImageEmbeddingMediaIO
from vllm.multimodal.media.video import VideoEmbeddingMediaIO

MEDIA_IO = {"image": ImageEmbeddingMediaIO, "video": VideoEmbeddingMediaIO, "audio": AudioEmbeddingMediaIO}


def main() -> None:
    payloads = json.load(sys.stdin)
    media_io = MEDIA_IO[sys.argv[2] if len(sys.argv) > 2 else "image"]()
    torch.save([media_io.load_base64("", data) for data in payloads], sys.argv[1])


if __name__ == "__main__":
    main()
