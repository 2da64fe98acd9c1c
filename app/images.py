"""Image sources to RGB images: data URIs, bare base64, raw bytes. Pure functions, no I/O.

Limits are checked before the expensive step: encoded size before base64 decoding, pixel count from
the header before the pixels are decoded (decompression bombs). Every failure is an
:class:`~app.errors.InvalidImage` or :class:`~app.errors.PayloadTooLarge` without item context; the
scheduler adds which item it was.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
import warnings

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from app.errors import InvalidImage, PayloadTooLarge

__all__ = ["decode_base64_image", "decode_image", "is_url"]

_DATA_URI = re.compile(r"data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[\w.+-]+=[\w.+-]+)*)(?P<b64>;base64)?,", re.I)
_WHITESPACE = re.compile(rb"\s+")
# Formats a client may send; anything else PIL could open (EPS, ...) is refused.
_ALLOWED_FORMATS = frozenset({"PNG", "JPEG", "MPO", "WEBP", "GIF", "BMP", "TIFF"})


def is_url(source: str) -> bool:
    return source[:8].lower().startswith(("http://", "https://"))


def decode_base64_image(source: str, *, max_bytes: int) -> bytes:
    """The file bytes of a data URI or bare base64 string."""
    payload = source
    match = _DATA_URI.match(source)
    if match:
        if not match.group("b64"):
            raise InvalidImage("data URI is not base64-encoded (';base64,' is required)")
        mime = (match.group("mime") or "").lower()
        if mime and not mime.startswith("image/"):
            raise InvalidImage(f"data URI has media type {mime!r}, not an image")
        payload = source[match.end() :]
    elif source[:5].lower() == "data:":
        raise InvalidImage("malformed data URI")
    # Base64 grows data by 4/3: refuse before decoding what cannot fit.
    if len(payload) // 4 * 3 > max_bytes + 3:
        raise PayloadTooLarge(
            f"image is over {max_bytes} bytes", details={"limit": "max_image_bytes", "max_bytes": max_bytes}
        )
    raw = _WHITESPACE.sub(b"", payload.encode("ascii", errors="replace"))
    try:
        data = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidImage(f"not valid base64 ({exc})") from None
    if len(data) > max_bytes:
        raise PayloadTooLarge(
            f"image is {len(data)} bytes, over the limit of {max_bytes}",
            details={"limit": "max_image_bytes", "max_bytes": max_bytes, "bytes": len(data)},
        )
    return data


def decode_image(data: bytes, *, max_pixels: int) -> Image.Image:
    """Decode file bytes into an upright RGB image (EXIF orientation applied, alpha over white)."""
    if not data:
        raise InvalidImage("image is empty (0 bytes)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            if image.format not in _ALLOWED_FORMATS:
                raise InvalidImage(f"unsupported image format {image.format!r}")
            width, height = image.size
            if width * height > max_pixels:
                raise PayloadTooLarge(
                    f"image is {width}x{height} = {width * height} pixels, over the limit of {max_pixels}",
                    details={"limit": "max_image_pixels", "max_pixels": max_pixels, "pixels": width * height},
                )
            if width < 1 or height < 1:
                raise InvalidImage(f"image has no pixels ({width}x{height})")
            image.seek(0)  # animated formats: the first frame
            image.load()
            return _to_rgb(ImageOps.exif_transpose(image))
    except (InvalidImage, PayloadTooLarge):
        raise
    except UnidentifiedImageError:
        raise InvalidImage("not a recognised image format") from None
    except (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError) as exc:
        raise InvalidImage(f"cannot decode image: {exc}") from None


def _to_rgb(image: Image.Image) -> Image.Image:
    if image.mode == "RGB":
        return image
    if image.mode in ("I;16", "I;16L", "I;16B", "I;16N", "I"):
        # 16/32-bit grey: scale to 8 bits instead of clipping everything above 255 to white.
        array = np.asarray(image, dtype=np.float64)
        peak = 65535.0 if image.mode.startswith("I;16") else max(float(array.max()), 1.0)
        image = Image.fromarray(np.clip(array / peak * 255.0 + 0.5, 0, 255).astype(np.uint8), mode="L")
    if image.mode == "CMYK" or image.mode not in ("RGBA", "LA", "P", "PA"):
        return image.convert("RGB")
    # As transformers' convert_to_rgb: composite transparency over white.
    rgba = image.convert("RGBA")
    background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(background, rgba).convert("RGB")
