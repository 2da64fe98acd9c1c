"""The servable tiny layout: what an LLM server reads is there and consistent (vLLM itself serves them in
tests/vllm_server/test_answers.py), and mmencode serves the same directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoTokenizer

from mmencode.models import load_encoder
from mmencode.models.tiny import build_tiny
from mmencode.models.tiny.servable import SERVABLE, TOKENIZER_SIZE, VOCAB_SIZE


@pytest.mark.parametrize("family", sorted(SERVABLE))
def test_a_servable_checkpoint_holds_its_tokens_at_its_config_ids(family: str, tmp_path: Path) -> None:
    directory = build_tiny(tmp_path / family, family, layout="servable")
    spec = SERVABLE[family]
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert len(tokenizer) == TOKENIZER_SIZE
    for token_id, token in spec.tokens.items():
        assert tokenizer.convert_tokens_to_ids(token) == token_id, token
    for attribute, token in spec.tokenizer_attributes.items():
        assert getattr(tokenizer, attribute) == token
    config = AutoConfig.from_pretrained(directory)
    for name, value in spec.config_ids.items():
        assert getattr(config, name) == value, name
    text = config.get_text_config()
    assert text.vocab_size == VOCAB_SIZE and text.max_position_embeddings >= 2048
    assert (directory / "chat_template.jinja").is_file()
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert "hi" in rendered
    # mmencode serves the same directory.
    adapter = load_encoder(directory, device=torch.device("cpu"), dtype=torch.float32, image_processor_backend="pil")
    assert adapter is not None


def test_the_servable_layout_is_the_same_on_every_build(tmp_path: Path) -> None:
    first = build_tiny(tmp_path / "a", "gemma3", layout="servable")
    second = build_tiny(tmp_path / "b", "gemma3", layout="servable")
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(p.name for p in second.iterdir())
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_the_full_layout_is_untouched_by_the_servable_one(tmp_path: Path) -> None:
    full = build_tiny(tmp_path / "full", "qwen2_vl")
    servable = build_tiny(tmp_path / "servable", "qwen2_vl", layout="servable")
    assert not (full / "tokenizer.json").exists()
    assert json.loads((full / "config.json").read_text())["text_config"]["vocab_size"] == 256
    assert json.loads((servable / "config.json").read_text())["text_config"]["vocab_size"] == VOCAB_SIZE


def test_families_without_a_servable_layout_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no servable layout"):
        build_tiny(tmp_path / "clip", "clip", layout="servable")
