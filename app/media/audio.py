"""Audio files to samples: wav, flac, mp3, ogg (anything FFmpeg demuxes) as mono float32 at the model's rate.

Decoded on the CPU with PyAV (FFmpeg inside its wheel), each frame converted to float32 by FFmpeg's own
sample-format conversion (16-bit PCM ``x`` becomes ``x / 32768``, as soundfile and librosa read it), the
channels averaged into one (librosa's ``to_mono``, vLLM's loaders too), then resampled to the feature
extractor's rate with soxr at its ``HQ`` quality, librosa's default resampler (transformers' examples
load audio with librosa). A clip already at that rate is not resampled, so its samples are the ones any
consumer decodes; at another rate the resamplers disagree in the last bits: vLLM 0.32 resamples with
torchaudio's windowed sinc by default (scipy, soxr or PyAV for some models).

Limits before the expensive step: the length the container declares, before any sample is decoded (a
ten-hour header is refused at once); the channel count; then the samples as they decode (a header that
understates its length stops at the limit). A file that decodes to fewer samples than its header
declares is truncated and refused: rows for part of a clip would pass for the clip. Failures are
:class:`~app.engine.errors.InvalidAudio` or :class:`~app.engine.errors.PayloadTooLarge` without item context; the
scheduler adds which item it was.
"""

from __future__ import annotations

import io
import wave
from dataclasses import dataclass
from typing import Any

import numpy as np

from mmencode.app.engine.errors import InvalidAudio, PayloadTooLarge
from mmencode.app.media.image import is_image_container
from mmencode.models.base import DecodedAudio

__all__ = ["AudioLimits", "audio_support", "decode_audio"]

# Mono and stereo: what speech models are given. More channels (5.1, 7.1, an 8-channel field recording)
# have no one downmix a model was trained on, and multiply the decoded bytes: refused, downmix first.
MAX_CHANNELS = 2
# A file's decoded length may fall short of its header by this much and still be whole (encoder delay and
# padding of lossy codecs; a header rounded to the millisecond).
_LENGTH_SLACK_S = 0.1


@dataclass(frozen=True, slots=True)
class AudioLimits:
    max_seconds: float


def audio_support() -> str | None:
    """``None`` when audio can be decoded and resampled here; otherwise why not, with the fix."""
    try:
        import av  # noqa: F401
        import soxr  # noqa: F401
    except ImportError as exc:
        return f"audio decoding needs PyAV and soxr ({exc.name} is missing): pip install 'mmencode[audio]'"
    return None


def decode_audio(data: bytes, limits: AudioLimits, sampling_rate: int) -> DecodedAudio:
    """The file's first audio stream, mono float32 at ``sampling_rate``."""
    import av
    import soxr

    with _open(data) as container:
        if is_image_container(container.format.name):
            raise InvalidAudio(
                f"this file is an image ({container.format.name.removesuffix('_pipe')}), not audio: send it as `image`",
                details={"format": container.format.name},
            )
        if container.streams.video:
            raise InvalidAudio(
                "this file holds a video stream: send it as `video` (a model that takes both reads the sound of a "
                "video from the video item), or send its sound track alone as `audio`",
                details={"format": container.format.name},
            )
        if not container.streams.audio:
            raise _not_audio("the file has no audio stream")
        stream = container.streams.audio[0]
        channels = stream.codec_context.channels or 0
        rate = stream.codec_context.sample_rate or stream.rate or 0
        if channels > MAX_CHANNELS:
            raise InvalidAudio(
                f"the audio has {channels} channels; mono or stereo only (downmix it first, e.g. "
                "`ffmpeg -i in.wav -ac 1 out.wav`)",
                details={"channels": channels, "max_channels": MAX_CHANNELS},
            )
        if rate <= 0:
            raise _not_audio("the stream declares no sample rate")
        declared = _declared_seconds(container, stream, data)
        if declared is not None:
            _check_seconds(declared, "its header declares", limits)
        budget = int(limits.max_seconds * rate) + 1
        # FFmpeg's own conversion to packed float32, same rate and layout: exact for PCM.
        converter = av.AudioResampler(format="flt", layout=stream.layout.name, rate=rate)
        chunks: list[np.ndarray] = []
        decoded = 0
        try:
            for frame in container.decode(stream):
                for converted in converter.resample(frame):
                    chunk = converted.to_ndarray().reshape(-1, channels or 1)
                    decoded += len(chunk)
                    if decoded > budget:  # longer than its header said, or it said nothing
                        _check_seconds(decoded / rate, "it decodes to more than", limits)
                    chunks.append(chunk)
        except av.error.FFmpegError as exc:
            raise _not_audio(f"{type(exc).__name__} after {decoded} samples: {exc}") from None
    if decoded == 0:
        raise _not_audio("the audio stream holds no sample")
    seconds = decoded / rate
    if declared is not None and seconds < declared - _LENGTH_SLACK_S:
        raise InvalidAudio(
            f"the audio is truncated: its header declares {declared:.3f} s, but only {seconds:.3f} s decode",
            details={"declared_seconds": round(declared, 3), "decoded_seconds": round(seconds, 3)},
        )
    samples = np.concatenate(chunks).mean(axis=1, dtype=np.float32) if channels > 1 else np.concatenate(chunks)[:, 0]
    if rate != sampling_rate:
        samples = soxr.resample(samples, rate, sampling_rate, quality="HQ")
    return DecodedAudio(samples=np.ascontiguousarray(samples, dtype=np.float32), sampling_rate=sampling_rate)


def _open(data: bytes) -> Any:
    import av

    try:
        return av.open(io.BytesIO(data), mode="r", metadata_errors="ignore")
    except (av.error.FFmpegError, ValueError, UnicodeDecodeError) as exc:
        raise _not_audio(f"{type(exc).__name__}: {exc}") from None


def _declared_seconds(container: Any, stream: Any, data: bytes) -> float | None:
    if container.format.name == "wav":
        # FFmpeg clamps a WAV's data chunk to the bytes present, so a cut file looks whole to it; the
        # standard library's reader reports the length the header declares (PCM files; others as FFmpeg says).
        try:
            with wave.open(io.BytesIO(data)) as header:
                return header.getnframes() / header.getframerate()
        except (wave.Error, EOFError, ZeroDivisionError):
            pass
    if stream.duration and stream.time_base:
        return float(stream.duration * stream.time_base)
    if container.duration:  # microseconds, all streams
        return container.duration / 1_000_000
    return None


def _check_seconds(seconds: float, what: str, limits: AudioLimits) -> None:
    if seconds > limits.max_seconds:
        raise PayloadTooLarge(
            f"the audio is too long: {what} {seconds:.1f} s, over the limit of {limits.max_seconds:g} s "
            "(--max-audio-seconds, or the model's feature extractor's window)",
            details={"limit": "max_audio_seconds", "max_seconds": limits.max_seconds, "seconds": round(seconds, 3)},
        )


def _not_audio(reason: str) -> InvalidAudio:
    return InvalidAudio(f"not audio FFmpeg can decode ({reason}); send a wav, flac, mp3 or ogg file")
