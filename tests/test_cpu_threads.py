"""How many threads a CPU forward uses: all cores for a tower that gains from them, one for a small one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mmencode.app.cpu_threads import choose_forward_threads
from mmencode.app.worker import EncoderWorker
from mmencode.models import load_encoder


def test_a_tower_that_gains_from_every_core_gets_them() -> None:
    # The mid-size Qwen2-VL tower on two cores (bench/README.md): 180 ms on one thread, 120 on two.
    assert choose_forward_threads(cores=2, forward_one=0.180, forward_all=0.120, preprocess=0.013) == 2


def test_timing_noise_does_not_flip_the_choice_either_way() -> None:
    # The mid tower timed on one thread in a fast minute and on two in a slow one: still both cores.
    assert choose_forward_threads(cores=2, forward_one=0.140, forward_all=0.125, preprocess=0.0034) == 2
    # A tiny CLIP whose millisecond forwards happened to look faster on two threads: still one, since
    # the core it leaves free preprocesses meanwhile.
    assert choose_forward_threads(cores=2, forward_one=0.0013, forward_all=0.0009, preprocess=0.0017) == 1


def test_a_small_tower_runs_on_one_thread_and_leaves_the_rest_to_preprocessing() -> None:
    # A tiny CLIP: its ops are too small to split; two threads are no faster than one.
    assert choose_forward_threads(cores=2, forward_one=0.0007, forward_all=0.0008, preprocess=0.0009) == 1
    # Faster on every core, but not by enough to pay for the cores preprocessing loses meanwhile.
    assert choose_forward_threads(cores=4, forward_one=0.010, forward_all=0.008, preprocess=0.012) == 1


def test_one_core_is_one_thread() -> None:
    assert choose_forward_threads(cores=1, forward_one=0.1, forward_all=0.1, preprocess=0.1) == 1


@pytest.mark.parametrize("configured", [1, 2])
def test_a_configured_thread_count_is_used_in_the_encoder_thread(checkpoints: dict[str, Path], configured: int) -> None:
    adapter = load_encoder(checkpoints["clip"], device=torch.device("cpu"), dtype=torch.float32)
    worker = EncoderWorker(adapter, max_batch_tokens=512, max_batch_items=8, batch_wait_s=0, max_queue=8)
    threads_before = torch.get_num_threads()
    worker.warmup(configured)
    assert worker.forward_threads == configured
    seen = worker._executor.submit(torch.get_num_threads).result()
    assert seen == configured
    assert torch.get_num_threads() == threads_before  # the caller's thread is left as it was
    worker._executor.shutdown()


def test_unset_threads_are_measured(checkpoints: dict[str, Path]) -> None:
    adapter = load_encoder(checkpoints["clip"], device=torch.device("cpu"), dtype=torch.float32)
    worker = EncoderWorker(adapter, max_batch_tokens=512, max_batch_items=8, batch_wait_s=0, max_queue=8)
    worker.warmup()
    assert worker.forward_threads in {1, torch.get_num_threads()}
    worker._executor.shutdown()
