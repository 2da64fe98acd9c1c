"""Build a tiny, offline CLIP dual-encoder checkpoint that both Infinity and mmencode can load.

Usage (either interpreter works; the project's venv is the reference one):

    /work/main/.venv/bin/python bench/infinity/make_clip.py /tmp/infinity-clip
    /tmp/infinity-venv/bin/python bench/infinity/make_clip.py /tmp/infinity-clip

With the project's venv (transformers 5.x) the weights, config and preprocessor_config.json come from
the project's own ``models.tiny.build_tiny(dir, "clip")``. Under an interpreter where that import fails
(e.g. Infinity's venv, transformers 4.x, which lacks ``*ImageProcessorPil``), an identical builder below
is used: same configs, same name-seeded fill, so the safetensors hold the same values.

Then a tiny hand-made byte-level BPE tokenizer (vocab.json + merges.txt, CLIP conventions) is added and
re-saved through ``CLIPTokenizer`` so tokenizer.json / tokenizer_config.json exist too; Infinity loads the
directory with ``AutoProcessor`` (CLIPProcessor = image processor + tokenizer) and embeds text at warmup.
Nothing touches the network.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO_ROOT = Path(__file__).resolve().parents[2]

_CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
_CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
VISION = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "image_size": 64,
    "patch_size": 8,
    "projection_dim": 32,
}
TEXT = {
    "vocab_size": 256,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "max_position_embeddings": 32,
    "projection_dim": 32,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
BOS, EOS = "<|startoftext|>", "<|endoftext|>"
MERGES = [
    ("t", "h"),
    ("th", "e</w>"),
    ("a", "n"),
    ("an", "d</w>"),
    ("i", "n"),
    ("in", "g</w>"),
    ("c", "a"),
    ("ca", "t</w>"),
]


def _build_weights_fallback(directory: Path) -> None:
    """Same checkpoint as ``models.tiny.build_tiny(directory, "clip")``, for transformers 4.x."""
    import numpy as np
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    torch.manual_seed(0)
    model = CLIPModel(CLIPConfig(text_config=TEXT, vision_config=VISION, projection_dim=32))
    with torch.no_grad():  # mirrors models.tiny.fill_deterministic
        for name, param in model.named_parameters():
            canonical = name.removeprefix("model.")
            seed = int.from_bytes(hashlib.blake2b(canonical.encode(), digest_size=8).digest(), "little")
            values = np.asarray(
                np.random.default_rng(seed).standard_normal(tuple(param.shape), dtype=np.float32), dtype=np.float32
            )
            if param.ndim == 1 and ("norm" in name or name.endswith("ln_1.weight")):
                values = 1.0 + 0.1 * values
            elif param.ndim == 1:
                values = 0.02 * values
            else:  # in float64 as numpy>=2 (NEP 50) does in the project's venv; numpy 1.x would stay float32
                values = values.astype(np.float64) / np.sqrt(max(1, int(np.prod(param.shape[1:]))))
            param.copy_(torch.as_tensor(values, dtype=torch.float32))
    model.save_pretrained(directory)
    CLIPImageProcessor(
        size={"shortest_edge": 64}, crop_size={"height": 64, "width": 64}, image_mean=_CLIP_MEAN, image_std=_CLIP_STD
    ).save_pretrained(directory)


def _build_weights(directory: Path) -> str:
    sys.path.insert(0, str(REPO_ROOT))
    try:
        from mmencode.models.tiny import build_tiny
    except ImportError as exc:  # not the project's venv (e.g. transformers 4.x)
        print(f"models.tiny not importable here ({exc}); using the built-in copy of the CLIP builder", file=sys.stderr)
        _build_weights_fallback(directory)
        return "fallback"
    build_tiny(directory, "clip", overwrite=True)
    return "models.tiny.build_tiny"


def _write_tokenizer(directory: Path) -> None:
    """A ~200-entry CLIP-style BPE vocabulary: printable ASCII, with and without ``</w>``, plus a few merges."""
    chars = [chr(c) for c in range(33, 127) if not chr(c).isupper()]  # CLIP lowercases its input
    tokens = [BOS, EOS] + chars + [c + "</w>" for c in chars] + ["".join(m) for m in MERGES]
    tokens = ["<|pad|>", *tokens]  # id 0 unused; <|startoftext|> = 1, <|endoftext|> = 2 as in the config
    assert len(tokens) == len(set(tokens)) and len(tokens) <= TEXT["vocab_size"], len(tokens)
    vocab_json = json.dumps({t: i for i, t in enumerate(tokens)}, ensure_ascii=False)
    merges_txt = "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in MERGES)
    (directory / "vocab.json").write_text(vocab_json)
    (directory / "merges.txt").write_text(merges_txt)
    # Load the raw BPE files the way each transformers major does (4.x: CLIPTokenizerFast converts them;
    # 5.x: CLIPTokenizer is tokenizers-backed), then save to add tokenizer.json + tokenizer_config.json.
    import transformers

    cls = getattr(transformers, "CLIPTokenizerFast", None) or transformers.CLIPTokenizer
    tok = cls.from_pretrained(
        str(directory),
        unk_token=EOS,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=EOS,
        model_max_length=TEXT["max_position_embeddings"],
    )
    ids = tok("The cat and a dog!")["input_ids"]
    assert ids[0] == 1 and ids[-1] == 2 and 2 not in ids[1:-1] and max(ids) < TEXT["vocab_size"], ids
    tok.save_pretrained(str(directory))
    # Keep the raw BPE files whatever save_pretrained wrote, so either CLIPTokenizer flavour can load.
    (directory / "vocab.json").write_text(vocab_json)
    (directory / "merges.txt").write_text(merges_txt)


def build(directory: Path | str) -> Path:
    directory = Path(directory).resolve()
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
    try:
        how = _build_weights(staging / "ckpt")
        _write_tokenizer(staging / "ckpt")
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(staging / "ckpt", directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    import transformers

    print(f"built {directory} with {how} (transformers {transformers.__version__})")
    print("files:", sorted(p.name for p in directory.iterdir()))
    return directory


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUTPUT_DIR")
    build(sys.argv[1])
