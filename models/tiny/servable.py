"""The servable layout: a tiny full VLM that an LLM server (vLLM) can serve, not only mmencode.

On top of the ``full`` layout it adds what a server needs and the encoder never reads: a small
byte-level BPE tokenizer (built deterministically with the ``tokenizers`` library, ~400 tokens) that
holds the family's special tokens at the ids its config names, a chat template, the whole processor
(tokenizer and, where the family has one, video processor saved beside the image processor) and a
text config with room for an image's rows plus a short answer (``max_position_embeddings``).

The language model is rebuilt from the family's config with a larger vocabulary and its special token
ids, then filled with seeded weights like every tiny checkpoint; the vision tower's weights are seeded
by name, so they are the same as the ``full`` layout's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedModel, PreTrainedTokenizerFast

__all__ = ["SERVABLE", "ServableSpec", "servable_model", "write_servable_files"]

VOCAB_SIZE = 512  # the embedding's rows: the tokenizer's ~400 tokens fit, with room for a server's padding
TOKENIZER_SIZE = 400
MAX_POSITIONS = 4096
SPECIAL_SLOTS = 32  # ids 0..31 are special tokens (named ones at the family's ids, the rest reserved)

# ChatML; a message's content is a string (vLLM puts its own image placeholder in front of the text).
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def chatml_with_image(marker: str) -> str:
    """ChatML over content parts, ``marker`` where an image goes: for families whose vLLM model names no
    placeholder of its own (Mistral 3) the template must put the processor's image token in."""
    return (
        "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
        "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for item in message['content'] %}"
        f"{{% if item['type'] == 'image' %}}{marker}"
        "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
        "{% endfor %}{% endif %}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )


# Qwen's own: content parts in order, each image or video as its placeholder between vision markers, as the
# Qwen-VL checkpoints on the hub ship it. Servers that render OpenAI-style parts through the template (SGLang:
# a template that renders `content` as a string makes it drop the images) and servers that put their own
# placeholder in front of a string (vLLM, which reads this one as parts too) both find the images.
QWEN_VL = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' or 'image' in item or 'image_url' in item %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif item['type'] == 'video' or 'video' in item %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in item %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Qwen2-Audio's own: each audio part as "Audio N: <|audio_bos|><|AUDIO|><|audio_eos|>", as the hub's
# Qwen2-Audio-Instruct ships it (content parts, which SGLang needs and vLLM reads too).
QWEN2_AUDIO = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% set audios = namespace(count=0) %}{% for item in message['content'] %}"
    "{% if item['type'] == 'audio' or 'audio' in item or 'audio_url' in item %}"
    "{% set audios.count = audios.count + 1 %}Audio {{ audios.count }}: <|audio_bos|><|AUDIO|><|audio_eos|>\n"
    "{% elif 'text' in item %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Gemma's: content parts in order, the image's marker glued to the text. vLLM's Gemma 3 processor finds
# the image's rows by the "\n\n" around them, which a newline of the template's own would merge into
# one "\n\n\n" token.
GEMMA = (
    "{{ bos_token }}{% for message in messages %}<start_of_turn>"
    "{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}<start_of_image>{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)

# A fixed text to learn merges from: the tokenizer is the same on every run and library version that
# trains BPE the same way (ties are broken by the trainer's own deterministic order).
_CORPUS = [
    "The quick brown fox jumps over the lazy dog. What is in this image? Describe the picture in detail.",
    "A photo of a cat sitting on a red chair next to the window, with a green plant and a blue cup.",
    "user assistant system image video picture colour color shape left right top bottom middle",
    "0123456789 one two three four five six seven eight nine ten hundred thousand",
]


@dataclass(frozen=True)
class ServableSpec:
    """What a family's servable checkpoint adds: its special tokens and where its config names them."""

    tokens: dict[int, str]  # id -> special token; ids below SPECIAL_SLOTS
    config_ids: dict[str, Any] = field(default_factory=dict)  # config attribute -> id or setting (top level)
    tokenizer_attributes: dict[str, str] = field(default_factory=dict)  # e.g. image_token -> "<image>"
    chat_template: str = CHATML
    bos: str | None = None
    eos: str = "<|im_end|>"
    video_processor: str | None = None  # transformers class name, saved beside the image processor
    # SigLIP/CLIP towers as the hub repos hold them (`vision_tower.vision_model.*`, transformers 4's
    # layout): vLLM 0.32 loads only that one, transformers 5 and mmencode load both.
    hub_vision_model: bool = False
    # Processor-level settings the server's processor reads and the full layout leaves at their defaults.
    processor_settings: dict[str, Any] = field(default_factory=dict)
    # Text config settings a server's kernels need beyond the full layout's.
    text_settings: dict[str, Any] = field(default_factory=dict)
    # Vision config settings a server reads beyond what transformers writes (SGLang's Qwen2-VL reads
    # `in_chans`, which the hub's Qwen2-VL configs carry from transformers 4).
    vision_settings: dict[str, Any] = field(default_factory=dict)


_CHATML_TOKENS = {0: "<|endoftext|>", 1: "<|im_start|>", 2: "<|im_end|>"}
_QWEN_TOKENS = {
    **_CHATML_TOKENS,
    10: "<|image_pad|>",
    11: "<|video_pad|>",
    12: "<|vision_start|>",
    13: "<|vision_end|>",
}
_QWEN_IDS = {"image_token_id": 10, "video_token_id": 11, "vision_start_token_id": 12, "vision_end_token_id": 13}
_QWEN_ATTRIBUTES = {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>"}

# Qwen2-Audio's: vLLM writes "Audio 1: <|audio_bos|><|AUDIO|><|audio_eos|>" before a message's text.
_QWEN2_AUDIO_TOKENS = {**_CHATML_TOKENS, 3: "<|AUDIO|>", 4: "<|audio_bos|>", 5: "<|audio_eos|>"}

SERVABLE: dict[str, ServableSpec] = {
    "qwen2_audio": ServableSpec(
        _QWEN2_AUDIO_TOKENS,
        {"audio_token_index": 3},
        {"audio_token": "<|AUDIO|>", "audio_bos_token": "<|audio_bos|>", "audio_eos_token": "<|audio_eos|>"},
        QWEN2_AUDIO,
    ),
    "qwen2_vl": ServableSpec(
        _QWEN_TOKENS,
        _QWEN_IDS,
        _QWEN_ATTRIBUTES,
        QWEN_VL,
        video_processor="Qwen2VLVideoProcessor",
        vision_settings={"in_chans": 3},
    ),
    "qwen2_5_vl": ServableSpec(
        _QWEN_TOKENS, _QWEN_IDS, _QWEN_ATTRIBUTES, QWEN_VL, video_processor="Qwen2VLVideoProcessor"
    ),
    "qwen3_vl": ServableSpec(
        _QWEN_TOKENS, _QWEN_IDS, _QWEN_ATTRIBUTES, QWEN_VL, video_processor="Qwen3VLVideoProcessor"
    ),
    "qwen3_5": ServableSpec(
        _QWEN_TOKENS,
        _QWEN_IDS,
        _QWEN_ATTRIBUTES,
        QWEN_VL,
        video_processor="Qwen3VLVideoProcessor",
        # vLLM's CPU Gated DeltaNet kernel wants a released head size (16: "expect head_dim to be multiples of
        # 32"; 32: "Unexpected head dim size, 32"); Qwen3.5 uses 128.
        text_settings={"linear_key_head_dim": 128, "linear_value_head_dim": 128},
    ),
    "glm4v": ServableSpec(
        {
            **_CHATML_TOKENS,
            10: "<|image|>",
            11: "<|video|>",
            12: "<|begin_of_image|>",
            13: "<|end_of_image|>",
            14: "<|begin_of_video|>",
            15: "<|end_of_video|>",
        },
        {"image_token_id": 10, "video_token_id": 11, "image_start_token_id": 12, "image_end_token_id": 13},
        {"image_token": "<|image|>", "video_token": "<|video|>"},
        video_processor="Glm4vVideoProcessor",
    ),
    "gemma3": ServableSpec(
        {
            0: "<pad>",
            1: "<bos>",
            2: "<eos>",
            3: "<start_of_turn>",
            4: "<end_of_turn>",
            5: "<image_soft_token>",
            6: "<start_of_image>",
            7: "<end_of_image>",
            # vLLM's Gemma 3 processor looks these up as single tokens (Gemma's SentencePiece vocabulary has them).
            8: "\n",
            9: "\n\n",
            10: "\n\n\n",
            11: "\n\n\n\n",
        },
        {"image_token_index": 5, "boi_token_index": 6, "eoi_token_index": 7},
        {"image_token": "<image_soft_token>", "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>"},
        GEMMA,
        bos="<bos>",
        eos="<end_of_turn>",
        hub_vision_model=True,
    ),
    "llava_onevision": ServableSpec(
        {**_CHATML_TOKENS, 5: "<image>", 6: "<video>"},
        # vLLM 0.32 counts LLaVA-OneVision's rows with anyres_max_9 whatever the config says (the full
        # layout's anyres_max_4 gives it more placeholders than rows), so the servable one uses 9.
        {"image_token_index": 5, "video_token_index": 6, "vision_aspect_ratio": "anyres_max_9"},
        {"image_token": "<image>", "video_token": "<video>"},
        video_processor="LlavaOnevisionVideoProcessor",
        hub_vision_model=True,
        processor_settings={"vision_aspect_ratio": "anyres_max_9"},
    ),
    "llava_next": ServableSpec(
        {**_CHATML_TOKENS, 5: "<image>"}, {"image_token_index": 5}, {"image_token": "<image>"}, hub_vision_model=True
    ),
    "idefics3": ServableSpec(
        {**_CHATML_TOKENS, 5: "<image>", 6: "<fake_token_around_image>", 7: "<global-img>", 8: "<end_of_utterance>"},
        {"image_token_id": 5},
        {"image_token": "<image>"},
    ),
    "smolvlm": ServableSpec(
        {**_CHATML_TOKENS, 5: "<image>", 6: "<fake_token_around_image>", 7: "<global-img>", 8: "<end_of_utterance>"},
        {"image_token_id": 5},
        {"image_token": "<image>"},
        video_processor="SmolVLMVideoProcessor",
    ),
    "mistral3": ServableSpec(
        {**_CHATML_TOKENS, 5: "[IMG]", 6: "[IMG_BREAK]", 7: "[IMG_END]"},
        {"image_token_index": 5},
        {"image_token": "[IMG]"},
        chatml_with_image("[IMG]"),
    ),
    "internvl": ServableSpec(
        {**_CHATML_TOKENS, 5: "<IMG_CONTEXT>", 6: "<img>", 7: "</img>", 8: "<video>"},
        {"image_token_id": 5},
        {
            "context_image_token": "<IMG_CONTEXT>",
            "start_image_token": "<img>",
            "end_image_token": "</img>",
            "video_token": "<video>",
        },
        video_processor="InternVLVideoProcessor",
        # 8x8 patches per 64-pixel tile, pixel-shuffled by 2: 16 rows (InternVLProcessor's default is 256).
        processor_settings={"image_seq_length": 16},
    ),
}


def servable_model(model: PreTrainedModel, spec: ServableSpec) -> PreTrainedModel:
    """The same family's model, rebuilt with the servable vocabulary, positions and token ids."""
    config = model.config
    text = config.get_text_config()
    text.vocab_size = VOCAB_SIZE
    text.max_position_embeddings = MAX_POSITIONS
    text.bos_token_id = _id_of(spec, spec.bos) if spec.bos else None
    text.eos_token_id = _id_of(spec, spec.eos)
    text.pad_token_id = 0
    for name, value in spec.text_settings.items():
        setattr(text, name, value)
    _fit_mrope(text)
    for name, value in spec.vision_settings.items():
        setattr(config.vision_config, name, value)
    for name, value in spec.config_ids.items():
        setattr(config, name, value)
    if hasattr(config, "vocab_size"):
        config.vocab_size = VOCAB_SIZE
    rebuilt: PreTrainedModel = type(model)(config)
    return rebuilt


def _fit_mrope(text: Any) -> None:
    """vLLM asserts that M-RoPE's sections cover the rotary half-dimension (transformers does not check):
    the full layout's [2, 3, 3] is scaled up to the servable text config's head size."""
    rope = getattr(text, "rope_parameters", None) or {}
    section = rope.get("mrope_section")
    if not section:
        return
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    half = int(head_dim * rope.get("partial_rotary_factor", 1.0)) // 2
    if sum(section) != half:
        assert half % sum(section) == 0, (section, half)
        rope["mrope_section"] = [s * (half // sum(section)) for s in section]


def _id_of(spec: ServableSpec, token: str) -> int:
    return next(i for i, t in spec.tokens.items() if t == token)


def build_tokenizer(spec: ServableSpec) -> PreTrainedTokenizerFast:
    """A byte-level BPE of ~400 tokens whose first SPECIAL_SLOTS ids are the family's special tokens."""
    slots = [spec.tokens.get(i, f"<|reserved_{i}|>") for i in range(SPECIAL_SLOTS)]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_SIZE,
        special_tokens=slots,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_CORPUS * 4, trainer)
    for i, token in enumerate(slots):
        assert backend.token_to_id(token) == i, (token, backend.token_to_id(token), i)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=spec.bos,
        eos_token=spec.eos,
        pad_token=spec.tokens[0],
        extra_special_tokens=dict(spec.tokenizer_attributes),
        chat_template=spec.chat_template,
    )
    tokenizer.model_max_length = MAX_POSITIONS
    return tokenizer


def write_servable_files(directory: Path, spec: ServableSpec, processor_class: str) -> None:
    """Tokenizer, chat template and video processor beside the checkpoint's image processor config."""
    if spec.processor_settings:
        whole_path = directory / "processor_config.json"
        whole = json.loads(whole_path.read_text()) if whole_path.exists() else {"processor_class": processor_class}
        whole.update(spec.processor_settings)
        whole_path.write_text(json.dumps(whole, indent=2, sort_keys=True) + "\n")
    tokenizer = build_tokenizer(spec)
    tokenizer.save_pretrained(directory)
    template = directory / "chat_template.jinja"
    if not template.exists():
        template.write_text(spec.chat_template)
    if spec.hub_vision_model:
        _to_hub_vision_layout(directory / "model.safetensors")
    if spec.video_processor is not None:
        import transformers

        video = getattr(transformers, spec.video_processor)()
        settings: dict[str, Any] = video.to_dict()
        (directory / "video_preprocessor_config.json").write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")


def _to_hub_vision_layout(weights: Path) -> None:
    tensors = load_file(str(weights))
    renamed = {
        "vision_tower.vision_model." + key.removeprefix("vision_tower.")
        if key.startswith("vision_tower.") and not key.startswith("vision_tower.vision_model.")
        else key: tensor
        for key, tensor in tensors.items()
    }
    save_file(renamed, str(weights), metadata={"format": "pt"})
