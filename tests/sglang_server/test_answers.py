"""SGLang's own encode/prefill split answers the same whether its encoder is SGLang or mmencode.

Per family, one SGLang 0.5.23 language-only server (``zmq_to_scheduler``) and two encoders: SGLang's own
``--encoder-only`` server, the reference, and mmencode installed as a user installs it (``pip install
".[video,audio]"``, .venv-plain) and started with no flag but its model (its SGLang dtype is then the
encoder's compute dtype, its image processor torchvision's, as SGLang's).
The language server is pointed at one encoder at a time through its own registration routes, and each
answer is checked to have gone through that encoder. The same prompt length, the same greedy tokens,
the same top-5 tokens with logprobs within 1e-4 (float32); a flipped image in the same test must move
them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
from PIL import Image, ImageOps

from bench.peers.sglang.server import Answer, SGLangServer, chat, dispatched_items, register, sglang_server
from mmencode.models.tiny import build_tiny
from tests.helpers import clip, data_uri, mmencode_process, noise_image, plain_mmencode, video_data_uri

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
    mmencode: str  # its URL

    def answer(self, encoder_url: str, parts: list[dict[str, Any]]) -> Answer:
        """The language server's answer with ``encoder_url`` as its only encoder, which must have served it."""
        register(self.language, encoder_url)
        before = dispatched_items(self.language)
        answer = chat(self.language, parts)
        assert dispatched_items(self.language) > before, "the encoder was not asked"
        return answer

    def compare(self, parts: list[dict[str, Any]], record: Callable[[str, object], None]) -> tuple[Answer, Answer]:
        reference = self.answer(self.sglang.url, parts)
        ours = self.answer(self.mmencode, parts)
        assert ours.prompt_tokens == reference.prompt_tokens
        assert ours.tokens == reference.tokens
        assert ours.same_top_tokens(reference)
        difference = ours.max_logprob_difference(reference)
        record("max_logprob_difference", difference)  # in --junitxml's report: the README's table
        assert difference <= TOLERANCE, difference
        return reference, ours


def _enter(stack: contextlib.ExitStack, manager: contextlib.AbstractContextManager[Any]) -> Any:
    return stack.enter_context(manager)


@pytest.fixture(scope="module", params=FAMILIES)
def split(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Split]:
    family = request.param
    root = tmp_path_factory.mktemp(f"sglang-{family}")
    checkpoint = build_tiny(root / "model", family, layout="servable")
    plain = plain_mmencode()
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(max_workers=3) as starter:
        started = [
            starter.submit(_enter, stack, sglang_server(checkpoint, root / "language.log", role="language")),
            starter.submit(_enter, stack, sglang_server(checkpoint, root / "encoder.log", role="encoder")),
            starter.submit(
                _enter, stack, mmencode_process(plain, "--model", str(checkpoint), log=root / "mmencode.log")
            ),
        ]
        language, sglang, mmencode = (future.result() for future in started)
        yield Split(family, language, sglang, mmencode)


@pytest.mark.parametrize("image", [WIDE, TALL, SQUARE], ids=["wide", "tall", "square"])
def test_one_image_gives_sglangs_own_answer(
    split: Split, image: Image.Image, record_property: Callable[[str, object], None]
) -> None:
    _, ours = split.compare([image_part(image)], record_property)
    flipped = split.answer(split.mmencode, [image_part(ImageOps.mirror(image))])
    assert flipped.moved_from(ours), "a flipped image gave the same answer: the rows do not reach the model"


def test_two_images_of_different_sizes_land_on_their_own_placeholders(
    split: Split, record_property: Callable[[str, object], None]
) -> None:
    _, ours = split.compare([image_part(WIDE), image_part(TALL)], record_property)
    swapped = split.answer(split.mmencode, [image_part(TALL), image_part(WIDE)])
    assert swapped.moved_from(ours), "the two images' rows are not each on its own placeholders"


@pytest.mark.parametrize("split", ["qwen3_vl"], indirect=True)
def test_a_video_gives_sglangs_own_answer(split: Split, record_property: Callable[[str, object], None]) -> None:
    """A clip through SGLang's split: mmencode's route samples it as SGLang's own encoder does (qwen-vl-utils'
    rules). Qwen3-VL only: SGLang 0.5.23's Qwen2.5-VL tower attends across a whole clip where transformers'
    (and vLLM's, and mmencode's) attends per pair of frames (srt/models/qwen2_5_vl.py:548-557), so its own
    rows differ from every other implementation's (0.013 in logprob measured; README, "Use with SGLang")."""
    video = {"type": "video_url", "video_url": {"url": video_data_uri(clip(20, 128, 96, fps=10, seed=411))}}
    _, ours = split.compare([video], record_property)
    other = {"type": "video_url", "video_url": {"url": video_data_uri(clip(20, 128, 96, fps=10, seed=412))}}
    assert split.answer(split.mmencode, [other]).moved_from(ours)
