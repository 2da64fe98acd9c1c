"""SGLang's own encode/prefill split answers the same whether its encoder is SGLang or mmencode.

Per family, one SGLang 0.5.23 language-only server (``zmq_to_scheduler``) and two encoders: SGLang's own
``--encoder-only`` server, the reference, and mmencode as ``mmencode serve`` starts it by default (no
flag: its SGLang dtype is the encoder's compute dtype, its image processor torchvision's, as SGLang's).
The language server is pointed at one encoder at a time through its own registration routes, and each
answer is checked to have gone through that encoder. The same prompt length, the same greedy tokens,
the same top-5 tokens with logprobs within 1e-4 (float32); a flipped image in the same test must move
them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
from PIL import Image, ImageOps

from mmencode.models.tiny import build_tiny
from tests.helpers import LiveServer, data_uri, live_server, noise_image
from tests.sglang_server.server import Answer, SGLangServer, chat, dispatched_items, register, sglang_server

FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]
TOLERANCE = 1e-4  # float32 on both sides: measured 2.4e-6 at most (README, "Use with SGLang")
# Different sizes and aspects: each item's rows must land on its own placeholders.
WIDE = noise_image(168, 84, seed=401)
TALL = noise_image(70, 140, seed=402)
SQUARE = noise_image(112, 112, seed=403)


def image_part(image: Image.Image) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": data_uri(image)}}


@dataclass
class Split:
    family: str
    language: SGLangServer
    sglang: SGLangServer  # SGLang's own --encoder-only server
    mmencode: LiveServer

    def answer(self, encoder_url: str, parts: list[dict[str, Any]]) -> Answer:
        """The language server's answer with ``encoder_url`` as its only encoder, which must have served it."""
        register(self.language, encoder_url)
        before = dispatched_items(self.language)
        answer = chat(self.language, parts)
        assert dispatched_items(self.language) >= before + len(parts), "the encoder was not asked"
        return answer

    def compare(self, parts: list[dict[str, Any]]) -> tuple[Answer, Answer]:
        reference = self.answer(self.sglang.url, parts)
        ours = self.answer(self.mmencode.url, parts)
        assert ours.prompt_tokens == reference.prompt_tokens
        assert ours.tokens == reference.tokens
        assert ours.same_top_tokens(reference)
        assert ours.max_logprob_difference(reference) <= TOLERANCE, ours.max_logprob_difference(reference)
        return reference, ours


def _enter(stack: contextlib.ExitStack, manager: contextlib.AbstractContextManager[Any]) -> Any:
    return stack.enter_context(manager)


@pytest.fixture(scope="module", params=FAMILIES)
def split(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Split]:
    family = request.param
    root = tmp_path_factory.mktemp(f"sglang-{family}")
    checkpoint = build_tiny(root / "model", family, layout="servable")
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(max_workers=3) as starter:
        started = [
            starter.submit(_enter, stack, sglang_server(checkpoint, root / "language.log", role="language")),
            starter.submit(_enter, stack, sglang_server(checkpoint, root / "encoder.log", role="encoder")),
            starter.submit(_enter, stack, live_server(model=checkpoint, cache_dir=root / "cache")),
        ]
        language, sglang, mmencode = (future.result() for future in started)
        yield Split(family, language, sglang, mmencode)


@pytest.mark.parametrize("image", [WIDE, TALL, SQUARE], ids=["wide", "tall", "square"])
def test_one_image_gives_sglangs_own_answer(split: Split, image: Image.Image) -> None:
    _, ours = split.compare([image_part(image)])
    flipped = split.answer(split.mmencode.url, [image_part(ImageOps.mirror(image))])
    assert flipped.tokens != ours.tokens or ours.max_logprob_difference(flipped) > 1e-3


def test_two_images_of_different_sizes_land_on_their_own_placeholders(split: Split) -> None:
    _, ours = split.compare([image_part(WIDE), image_part(TALL)])
    swapped = split.answer(split.mmencode.url, [image_part(TALL), image_part(WIDE)])
    assert swapped.tokens != ours.tokens or ours.max_logprob_difference(swapped) > 1e-3
