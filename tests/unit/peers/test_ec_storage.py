"""The connector directory's budget: least recently used files go first, never one younger than the minimum
age (writes are refused instead), one budget for writers sharing the directory, a trim at start, pins."""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from pathlib import Path

import pytest
import torch

from mmencode.app.metrics import Metrics
from mmencode.app.peers.vllm.ec_storage import EC_LOCK_NAME
from mmencode.app.peers.vllm.ec_writer import EncoderCacheWriter

ROWS = torch.ones(64, 8)  # 2,048 bytes of float32 rows, and the safetensors header


def _writer(root: Path, max_bytes: int, min_age_s: float = 0.0, metrics: Metrics | None = None) -> EncoderCacheWriter:
    return EncoderCacheWriter(root, "float32", metrics or Metrics(), max_bytes=max_bytes, min_age_s=min_age_s)


def _hash(n: int) -> str:
    return f"{n:032x}"


def _on_disk(root: Path) -> tuple[int, int]:
    sizes = []
    for file in root.glob("*/encoder_cache.safetensors"):
        try:
            sizes.append(file.stat().st_size)
        except FileNotFoundError:  # removed by another writer between the listing and the stat
            continue
    return sum(sizes), len(sizes)


def _file_size(tmp_path: Path) -> int:
    written = _writer(tmp_path / "probe", 0).write(_hash(0), ROWS)
    assert written is not None
    return written.stat().st_size


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def _metric(metrics: Metrics, sample: str) -> float:
    for line in metrics.render().decode().splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_three_times_the_budget_stays_within_it_least_recently_used_first(tmp_path: Path) -> None:
    size = _file_size(tmp_path)
    metrics = Metrics()
    writer = _writer(tmp_path / "ec", max_bytes=10 * size, metrics=metrics)
    kept = writer.write(_hash(1), ROWS)
    assert kept is not None
    for n in range(2, 31):
        assert writer.write(_hash(n), ROWS) is not None
        if n % 3 == 0:  # an answer names the first file again: it stays the most recently used
            assert writer.write(_hash(1), ROWS) == kept
        on_disk, files = _on_disk(tmp_path / "ec")
        assert on_disk <= 10 * size, f"{files} files after {n} writes"
    assert kept.is_file()
    assert not (tmp_path / "ec" / _hash(2)).exists()  # the least recently used went first, folder and all
    assert _metric(metrics, "mmencode_ec_storage_evictions_total") >= 20
    assert _metric(metrics, "mmencode_ec_storage_bytes") == _on_disk(tmp_path / "ec")[0]
    assert _metric(metrics, "mmencode_ec_storage_files") == _on_disk(tmp_path / "ec")[1]


def test_no_file_younger_than_the_minimum_age_is_removed_writes_are_refused_instead(tmp_path: Path) -> None:
    size = _file_size(tmp_path)
    metrics = Metrics()
    root = tmp_path / "ec"
    writer = _writer(root, max_bytes=3 * size, min_age_s=60, metrics=metrics)
    paths = [writer.write(_hash(n), ROWS) for n in range(3)]
    assert all(path is not None for path in paths)
    assert writer.write(_hash(3), ROWS) is None  # all three are young
    assert _on_disk(root) == (3 * size, 3)
    assert _metric(metrics, 'mmencode_ec_cache_writes_total{result="refused"}') == 1
    # A file already there is still answered: naming it removes nothing and needs no room.
    assert writer.write(_hash(1), ROWS) == paths[1]
    # Once one has aged past the minimum, it makes room.
    assert paths[0] is not None
    _age(paths[0], 61)
    assert writer.write(_hash(3), ROWS) is not None
    assert not paths[0].exists() and all(p is not None and p.exists() for p in paths[1:])


def test_replicas_sharing_the_directory_keep_one_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two writers of their own (each its own lock file handle, as two processes have) writing at once, each
    file taking a while to land, so that trims rescan the directory while the other's files are on their way."""
    size = _file_size(tmp_path)
    root = tmp_path / "ec"
    replicas = [_writer(root, max_bytes=8 * size), _writer(root, max_bytes=8 * size)]
    write_file = EncoderCacheWriter._write_file

    def slowly(self: EncoderCacheWriter, target: Path, blob: bytes) -> None:
        time.sleep(0.003)
        write_file(self, target, blob)

    monkeypatch.setattr(EncoderCacheWriter, "_write_file", slowly)
    peak = 0
    errors: list[str] = []

    def write(replica: int) -> None:
        nonlocal peak
        for n in range(25):
            if replicas[replica].write(_hash(1000 * (replica + 1) + n), ROWS) is None:
                errors.append(f"replica {replica} item {n}")
            # Counted as a third process would, under the lock: a listing is not atomic, so without it a file
            # removed after it was listed and one written before the listing ended would both count.
            with open(root / EC_LOCK_NAME, "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                peak = max(peak, _on_disk(root)[0])

    threads = [threading.Thread(target=write, args=(r,)) for r in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert peak <= 8 * size
    # The count both keep is the directory's.
    assert replicas[0].storage.usage.bytes == _on_disk(root)[0] or replicas[1].storage.usage.bytes == _on_disk(root)[0]


def test_a_directory_over_budget_at_start_is_trimmed_past_the_minimum_age(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    size = _file_size(tmp_path)
    root = tmp_path / "ec"
    unbounded = _writer(root, max_bytes=0)
    paths = [unbounded.write(_hash(n), ROWS) for n in range(12)]
    for path in paths[:10]:
        assert path is not None
        _age(path, 3600)  # ten files an hour old, two just written
    (root / ("ab" * 16)).mkdir()  # an empty folder vLLM left behind, young: kept
    caplog.set_level(logging.INFO, logger="mmencode.vllm")
    bounded = _writer(root, max_bytes=4 * size, min_age_s=120)
    report = bounded.storage.open()
    assert report.before.files == 12 and report.after.bytes <= 4 * size
    assert report.evicted == 12 - report.after.files
    assert all(p is not None and p.exists() for p in paths[10:])  # the young ones stay
    lines = [r.getMessage() for r in caplog.records if "over its budget" in r.getMessage()]
    assert len(lines) == 1 and "removed" in lines[0]
    assert (root / ("ab" * 16)).is_dir()
    old_empty = root / ("cd" * 16)
    old_empty.mkdir()
    _age(old_empty, 3600)
    bounded.storage.upkeep()  # a rescan (the count says nothing of folders): forced by an unreadable count
    assert old_empty.is_dir()  # upkeep reads the count; only a scan removes leftovers
    (root / ".mmencode-ec.usage").write_text("not json")
    bounded.storage.upkeep()
    assert not old_empty.exists() and (root / ("ab" * 16)).is_dir()


def test_pinned_files_stay_however_old_and_are_kept_young_for_other_replicas(tmp_path: Path) -> None:
    size = _file_size(tmp_path)
    root = tmp_path / "ec"
    writer = _writer(root, max_bytes=2 * size, min_age_s=60)
    first = writer.write(_hash(1), ROWS)
    assert first is not None
    writer.storage.pin([_hash(1)])
    _age(first, 3600)
    assert writer.write(_hash(2), ROWS) is not None
    assert writer.write(_hash(3), ROWS) is None  # the old file is pinned, the other young: refused
    assert first.exists()
    writer.storage.upkeep()
    assert time.time() - first.stat().st_mtime < 5  # touched: young in every replica's eyes
    writer.storage.unpin([_hash(1)])
    _age(first, 3600)
    assert writer.write(_hash(3), ROWS) is not None and not first.exists()
