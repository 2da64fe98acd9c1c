"""Image sources to RGB images: data URIs, bare base64, raw bytes. Pure functions, no I/O.

Limits are checked before the expensive step: encoded size before base64 decoding, pixel count from
the header before the pixels are decoded (decompression bombs). Every failure is an
:class:`~app.engine.errors.InvalidImage` or :class:`~app.engine.errors.PayloadTooLarge` without item context; the
scheduler adds which item it was.
"""

from __future__ import annotations

import binascii
import io
import re
import warnings

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from mmencode.app.engine.errors import InvalidImage, PayloadTooLarge
from mmencode.app.media.b64 import decode_strict
from mmencode.app.media.kinds import IMAGE, MediaKind
from mmencode.app.media.sniff import sniff

__all__ = [
    "decode_base64_file",
    "decode_base64_image",
    "decode_image",
    "decode_inline_image",
    "is_url",
]

_DATA_URI = re.compile(r"data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[\w.+-]+=[\w.+-]+)*)(?P<b64>;base64)?,", re.I)
_WHITESPACE = re.compile(rb"\s+")
# Formats a client may send; anything else PIL could open (EPS, ...) is refused.
_OPEN_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")  # the JPEG parser also opens MPO files
_ALLOWED_FORMATS = frozenset({*_OPEN_FORMATS, "MPO"})
_PILLOW_PIXELS = re.compile(r"\((\d+) pixels\)")
# Base64 never holds a space (line breaks at most), and no image file fits in a few characters.
_BASE64_TEXT = re.compile(r"[A-Za-z0-9+/=_\-\r\n]*")
_SHORTEST_IMAGE_BASE64 = 32


# Any "scheme:" but data: is a URL: base64 has no ':', and the fetcher refuses schemes other than http(s)
# with url_not_allowed (a file:// or ftp:// image must not read as "invalid base64").
_URL_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


def is_url(source: str) -> bool:
    match = _URL_SCHEME.match(source[:64])
    return match is not None and match.group().lower() != "data:"


def _text_sent_as_image() -> InvalidImage:
    """Text sent where an image goes is the likeliest mistake: say so, not "invalid base64"."""
    return InvalidImage(
        "not an image: this service encodes images only, not text. Send each image as a data URI "
        "(data:image/png;base64,...), the file's bare base64, an http(s) URL, or a multipart file part "
        "(-F image=@cat.jpg, /v1/encode)",
        details={
            "accepted": [
                "data:image/...;base64 URI",
                "bare base64 of the image file",
                "http(s) image URL",
                "multipart file (/v1/encode)",
            ]
        },
    )


def decode_inline_image(source: str, *, max_bytes: int) -> bytes:
    """The file bytes of an image sent inline (data URI or bare base64); text sent where an image goes
    (a prompt, a caption) is refused as text."""
    bare = source[:5].lower() != "data:"
    if bare and len(source.strip()) < _SHORTEST_IMAGE_BASE64:
        raise _text_sent_as_image()  # no image file fits in so few characters
    try:
        return decode_base64_image(source, max_bytes=max_bytes)
    except InvalidImage:
        if bare and not _BASE64_TEXT.fullmatch(source.strip()):
            raise _text_sent_as_image() from None  # words and punctuation: text, not an image's base64
        raise


def is_image_container(format_name: str) -> bool:
    """Whether FFmpeg opened a file as an image: still images come as one-frame streams (``png_pipe``,
    ``image2``...) and GIFs as clips. Neither is a video or audio item, and their rows would be counted as
    one."""
    return format_name.endswith("_pipe") or format_name in {"image2", "gif", "apng"}


def decode_base64_image(source: str, *, max_bytes: int) -> bytes:
    """The file bytes of an image's data URI or bare base64 string."""
    return decode_base64_file(source, max_bytes=max_bytes, kind=IMAGE)


def decode_base64_file(source: str, *, max_bytes: int, kind: MediaKind) -> bytes:
    """The file bytes of a data URI (whose media type must be ``kind``'s) or bare base64 string."""
    payload = source
    match = _DATA_URI.match(source)
    if match:
        if not match.group("b64"):
            raise kind.error("data URI is not base64-encoded (';base64,' is required)")
        mime = (match.group("mime") or "").lower()
        if mime and not mime.startswith(f"{kind.name}/"):
            raise kind.error(f"data URI has media type {mime!r}, not {_article(kind.name)}")
        payload = source[match.end() :]
    elif source[:5].lower() == "data:":
        raise kind.error("malformed data URI")
    # Base64 grows data by 4/3: refuse before decoding what cannot fit (line breaks do not count).
    raw: str | bytes = payload
    if _decoded_size(raw) > max_bytes + 3:
        raw = _without_whitespace(raw)
        if _decoded_size(raw) > max_bytes + 3:
            raise PayloadTooLarge(
                f"{kind.name} is over {max_bytes} bytes, the limit ({kind.flag})",
                details={"limit": kind.limit, "max_bytes": max_bytes},
            )
    try:
        # One strict SIMD pass over the usual base64 without line breaks (a whitespace-stripping regex
        # over every request's payload took 5x as long as the decoding itself).
        data = decode_strict(raw)
    except (binascii.Error, ValueError) as exc:
        # Line breaks (MIME-style base64) are not data: strip them and try once more.
        stripped = _without_whitespace(raw)
        if len(stripped) == len(raw):  # nothing to strip: the base64 itself is wrong
            raise kind.error(f"not valid base64 ({exc})") from None
        try:
            data = decode_strict(stripped)
        except (binascii.Error, ValueError) as again:
            raise kind.error(f"not valid base64 ({again})") from None
    if len(data) > max_bytes:
        raise PayloadTooLarge(
            f"{kind.name} is {len(data)} bytes, over the limit of {max_bytes} ({kind.flag})",
            details={"limit": kind.limit, "max_bytes": max_bytes, "bytes": len(data)},
        )
    return data


def _article(noun: str) -> str:
    return f"an {noun}" if noun[0] in "aeiou" else f"a {noun}"


def _decoded_size(encoded: str | bytes) -> int:
    return len(encoded) // 4 * 3


def _without_whitespace(encoded: str | bytes) -> bytes:
    if isinstance(encoded, str):
        encoded = encoded.encode("ascii", errors="replace")  # a non-ASCII character stays invalid as "?"
    return _WHITESPACE.sub(b"", encoded)


def decode_image(data: bytes, *, max_pixels: int) -> Image.Image:
    """Decode file bytes into an upright RGB image (EXIF orientation applied, alpha over white)."""
    if not data:
        raise InvalidImage("image is empty (0 bytes)")
    try:
        with warnings.catch_warnings():
            # Hostile files make Pillow warn (corrupt EXIF, bomb-sized headers): the answer says it all.
            # Only Pillow's own warnings: catch_warnings is not thread-safe, so a filter may outlive it.
            warnings.filterwarnings("ignore", module=r"PIL\.")
            # Only the allowed formats' parsers ever see the bytes (no TGA/EPS/... guessing).
            image = Image.open(io.BytesIO(data), formats=_OPEN_FORMATS)
            if image.format not in _ALLOWED_FORMATS:
                raise InvalidImage(f"unsupported image format {image.format!r}")
            width, height = image.size
            if width * height > max_pixels:
                raise _too_many_pixels(f"{width}x{height} = {width * height}", width * height, max_pixels)
            if width < 1 or height < 1:
                raise InvalidImage(f"image has no pixels ({width}x{height})")
            image.seek(0)  # animated formats: the first frame
            image.load()
            # In place: without an orientation tag the default returns a full copy of the pixels.
            ImageOps.exif_transpose(image, in_place=True)
            return _to_rgb(image)
    except (InvalidImage, PayloadTooLarge):
        raise
    except UnidentifiedImageError:
        message = f"not a recognised image format (one of {', '.join(_OPEN_FORMATS)})"
        looks = sniff(data)
        if looks is not None and looks[1] != "image":
            message += f"; the file looks like {looks[0]}: send it as the item's `{looks[1]}`"
        raise InvalidImage(message) from None
    except Image.DecompressionBombError as exc:
        # Pillow's own guard fired while reading the header (over 2 * Image.MAX_IMAGE_PIXELS): the
        # image is over the effective pixel limit, whatever max_pixels says.
        found = _PILLOW_PIXELS.search(str(exc))
        pixels = int(found.group(1)) if found else None
        limit = min(max_pixels, 2 * (Image.MAX_IMAGE_PIXELS or max_pixels))
        raise _too_many_pixels(str(pixels) if pixels else "too many", pixels, limit) from None
    except MemoryError:
        raise
    except Exception as exc:
        # Decoders meet arbitrary bytes here: whatever they raise (OSError, SyntaxError, struct.error,
        # TypeError from a corrupt TIFF tag, ...) means the image cannot be decoded, not a server fault.
        raise InvalidImage(f"cannot decode image: {type(exc).__name__}: {exc}") from None


def _too_many_pixels(said: str, pixels: int | None, max_pixels: int) -> PayloadTooLarge:
    details: dict[str, object] = {"limit": "max_image_pixels", "max_pixels": max_pixels}
    if pixels is not None:
        details["pixels"] = pixels
    return PayloadTooLarge(
        f"image is {said} pixels, over the limit of {max_pixels}; send a smaller image, or raise "
        "--max-image-pixels (MMENCODE_MAX_IMAGE_PIXELS)",
        details=details,
    )


def _to_rgb(image: Image.Image) -> Image.Image:
    if image.mode == "RGB":
        return image
    if image.mode in ("I;16", "I;16L", "I;16B", "I;16N", "I", "F"):
        image = Image.fromarray(_grey_to_8bit(image), mode="L")
    if image.mode == "CMYK" or image.mode not in ("RGBA", "LA", "P", "PA"):
        return image.convert("RGB")
    # As transformers' convert_to_rgb: composite transparency over white.
    rgba = image.convert("RGBA")
    background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(background, rgba).convert("RGB")


def _grey_to_8bit(image: Image.Image) -> np.ndarray:
    """16-bit, 32-bit integer or float grey as 8 bits, scaled from its nominal range, not clipped to white.

    The range is the sample type's, never the image's own maximum, so a uniform mid-grey stays
    mid-grey: ``I;16`` is 0..65535; ``I`` (a 32-bit container, most often of 16-bit data) is 0..255 if
    every value fits, else 0..65535 if every value fits, else the int32 range; ``F`` is 0..1 if every
    value fits (the usual float convention), else 0..255 as Pillow's own conversion reads it.
    """
    array = np.nan_to_num(np.asarray(image, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    top = float(array.max()) if array.size else 0.0
    if image.mode.startswith("I;16"):
        peak = 65535.0
    elif image.mode == "I":
        peak = 255.0 if top <= 255 else 65535.0 if top <= 65535 else float(2**31 - 1)
    else:
        peak = 1.0 if top <= 1.0 else 255.0
    return np.clip(array / peak * 255.0 + 0.5, 0, 255).astype(np.uint8)
