"""vLLM's side of ``image_embeds``, ``video_embeds`` and ``audio_embeds``, run with the peers venv's Python
(vllm 0.34.0, --no-deps).

Reads a JSON list of base64 payloads (``embedding.data`` of ``pt`` or ``npy`` items) on stdin and
decodes each with ``ImageEmbeddingMediaIO.load_base64`` (``VideoEmbeddingMediaIO``'s with ``video``,
``AudioEmbeddingMediaIO``'s with ``audio``), exactly as vLLM's chat API does for an ``image_embeds``
(``video_embeds``, ``audio_embeds``) content part. Writes the tensors to OUT with ``torch.save``.

usage: python vllm_decode.py OUT [image|video|audio] < payloads.json
       python vllm_decode.py OUT video,image,... < payloads.json   (one modality per payload)
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
    modalities = (sys.argv[2] if len(sys.argv) > 2 else "image").split(",")
    if len(modalities) == 1:
        modalities *= len(payloads)
    decoded = [MEDIA_IO[m]().load_base64("", data) for m, data in zip(modalities, payloads, strict=True)]
    torch.save(decoded, sys.argv[1])


if __name__ == "__main__":
    main()
