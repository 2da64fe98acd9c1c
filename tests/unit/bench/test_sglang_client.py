"""bench.sglang_client plays SGLang's language side: it reads the pushes an encoder sends (here mmencode's own
frames, as tests/peers checks SGLang reads them), and bench.proctree counts a server's children's CPU."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.proctree import tree_cpu_seconds, tree_pids
from bench.sglang_client import _parse, encode_body
from mmencode.app.engine.errors import InvalidImage
from mmencode.app.peers.sglang.protocol import embedding_frames, error_frames
from mmencode.schemas.sglang import SGLangEncodeRequest


def _request() -> SGLangEncodeRequest:
    return SGLangEncodeRequest.model_validate(encode_body("data:image/jpeg;base64,AAAA", 5555, "http://encoder"))


def test_the_body_is_one_part_of_one_request_pushed_to_the_given_port() -> None:
    request = _request()
    assert (request.num_parts, request.part_idx, request.embedding_port) == (1, 0, 5555)
    assert request.req_id.endswith("_local_part_0")


def test_a_push_gives_its_req_id_shape_and_rows() -> None:
    rows = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    request = _request()
    frames = [bytes(frame) for frame in embedding_frames(request, rows, [[1, 6, 2]])]
    push = _parse(frames, arrived=1.5)
    assert (push.req_id, push.shape, push.dtype, push.error, push.arrived) == (
        request.req_id,
        (3, 4),
        torch.float32,
        None,
        1.5,
    )
    np.testing.assert_array_equal(push.array(), rows.numpy())


def test_short_rows_and_error_frames_are_failures() -> None:
    request = _request()
    header, rows = (bytes(frame) for frame in embedding_frames(request, torch.ones(3, 4), [[1, 6, 2]]))
    assert _parse([header, rows[:-4]], arrived=0.0).error == "44 bytes of rows, not 48"
    failed = _parse([bytes(f) for f in error_frames(request, InvalidImage("not an image"))], arrived=0.0)
    assert failed.error is not None and "not an image" in failed.error


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads /proc")
def test_a_child_process_cpu_counts_in_its_parent_tree() -> None:
    burn = "import time\nwhile time.process_time() < 0.3: pass\ntime.sleep(30)"
    parent = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {burn!r}])"]
    )
    try:
        deadline = time.monotonic() + 60
        while tree_cpu_seconds(parent.pid) < 0.3:
            assert time.monotonic() < deadline, "the child's CPU never showed in its parent's tree"
            time.sleep(0.05)
        assert len(tree_pids(parent.pid)) == 2
    finally:
        for pid in reversed(tree_pids(parent.pid)):
            subprocess.run(["kill", str(pid)], check=False)
        parent.wait(10)
