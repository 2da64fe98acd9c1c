"""What a file looks like from its first bytes, for the hint in an error message: never to accept one.

A client that sends a clip as ``image``, or a JPEG as the raw request body, gets told what it sent and
where such a file goes, instead of only "not an image" or "invalid JSON".
"""

from __future__ import annotations

from mmencode.models.base import Modality

__all__ = ["sniff"]

# (magic at offset 0, or (offset, magic)), what it is, which field takes it
_SIGNATURES: list[tuple[int, bytes, str, Modality]] = [
    (0, b"\xff\xd8\xff", "a JPEG image", "image"),
    (0, b"\x89PNG\r\n\x1a\n", "a PNG image", "image"),
    (0, b"GIF8", "a GIF image", "image"),
    (8, b"WEBP", "a WebP image", "image"),
    (4, b"ftyp", "an MP4 (or MOV) video", "video"),
    (0, b"\x1a\x45\xdf\xa3", "a Matroska (mkv or webm) video", "video"),
    (8, b"AVI ", "an AVI video", "video"),
    (8, b"WAVE", "a WAV audio file", "audio"),
    (0, b"fLaC", "a FLAC audio file", "audio"),
    (0, b"OggS", "an Ogg audio file", "audio"),
    (0, b"ID3", "an MP3 audio file", "audio"),
]


def sniff(data: bytes) -> tuple[str, Modality] | None:
    """``(what it looks like, the item field that takes it)``, or ``None`` when nothing is recognised."""
    head = data[:16]
    for offset, magic, name, field in _SIGNATURES:
        if head[offset : offset + len(magic)] == magic:
            return name, field
    if len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0:  # an MPEG audio frame without ID3
        return "an MP3 audio file", "audio"
    return None
