"""SGLang's side of the encoder protocol, run with the peers venv's Python (sglang 0.5.23, --no-deps).

Binds a ZMQ PULL socket on loopback as SGLang's language server does, prints its port, receives
``count`` messages and decodes each with SGLang's own code: ``safe_pickle_loads`` for frame 0, the
receiver's ``torch.frombuffer(buffer, dtype=obj.dtype).reshape(obj.shape)`` for frame 1 and its
``_cat_grid`` for ``grid_dim``. Writes what it decoded to ``out`` with ``torch.save``.

``sglang.srt.disaggregation.encoder.receiver`` (where ``EmbeddingData`` lives) imports the whole
language-server stack (uvicorn, fastapi, SGLang's scheduler and model configs) and, through
``sglang.srt.configs``, torchvision, which cannot sit beside the local CPU torch here. When that import
fails, the module is rebuilt from SGLang's own source of ``EmbeddingData`` and ``_cat_grid``, taken
from the installed receiver.py, and registered under its real name: the unpickler, its allow-list and
the class are SGLang's.

usage: python sglang_receive.py OUT COUNT [TIMEOUT_S]
"""

from __future__ import annotations

import ast
import sys
import types
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import zmq

RECEIVER = "sglang.srt.disaggregation.encoder.receiver"


def receiver_module() -> tuple[types.ModuleType, str]:
    try:
        import importlib

        return importlib.import_module(RECEIVER), "imported"
    except ImportError as exc:
        missing = exc.name
    import sglang

    source = Path(sglang.__file__).parent / "srt" / "disaggregation" / "encoder" / "receiver.py"
    tree = ast.parse(source.read_text())
    wanted = {"EmbeddingData", "_cat_grid"}
    nodes = [n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name in wanted]
    assert {n.name for n in nodes} == wanted, "sglang's receiver.py changed"
    module = types.ModuleType(RECEIVER)
    module.__dict__.update(Optional=Optional, torch=torch, np=np)
    exec(compile(ast.Module(body=nodes, type_ignores=[]), str(source), "exec"), module.__dict__)
    sys.modules[RECEIVER] = module
    return module, f"rebuilt from receiver.py, which cannot import here (no {missing})"


def main() -> None:
    out, count = Path(sys.argv[1]), int(sys.argv[2])
    timeout_ms = int(float(sys.argv[3] if len(sys.argv) > 3 else 60) * 1000)
    receiver, how = receiver_module()
    from sglang.srt.utils.common import safe_pickle_loads

    context = zmq.Context()
    sock = context.socket(zmq.PULL)
    sock.setsockopt(zmq.RCVTIMEO, timeout_ms)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    print(port, flush=True)
    messages = []
    for _ in range(count):
        parts = sock.recv_multipart(copy=False)
        obj = safe_pickle_loads(parts[0])
        decoded = {
            "class": f"{type(obj).__module__}.{type(obj).__qualname__}",
            "is_sglang_class": isinstance(obj, receiver.EmbeddingData),
            "frames": len(parts),
            "attributes": sorted(vars(obj)),
            "req_id": obj.req_id,
            "num_parts": obj.num_parts,
            "part_idx": obj.part_idx,
            "modality": f"{type(obj.modality).__module__}.{obj.modality!r}",
            "dtype": obj.dtype,
            "shape": obj.shape,
            "error_msg": obj.error_msg,
            "error_code": obj.error_code,
            "embedding": None,
            "grid": None,
            # Video metadata SGLang's encoder sends as extra attributes (receiver.py chains them per part).
            "second_per_grid_ts": getattr(obj, "second_per_grid_ts", None),
            "video_timestamps": getattr(obj, "video_timestamps", None),
        }
        if obj.error_msg is None:
            # receiver.py: _extract_embedding_from_buffer
            buffer = parts[1].buffer if hasattr(parts[1], "buffer") else parts[1]
            decoded["embedding"] = torch.frombuffer(buffer, dtype=obj.dtype).reshape(obj.shape).clone()
            # An AUDIO part's grid is flattened by the receiver (_MODALITY_GRID_ATTRS): it calls .flatten() on it.
            audio = obj.modality.name == "AUDIO"
            decoded["grid"] = receiver._cat_grid([obj.get_grid()], flatten_items=audio)
            decoded["grid_is_tensor"] = isinstance(obj.get_grid(), torch.Tensor)
        messages.append(decoded)
    sock.close(linger=0)
    context.term()
    torch.save({"how": how, "messages": messages}, out)


if __name__ == "__main__":
    main()
