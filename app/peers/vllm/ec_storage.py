"""The connector directory's byte budget (``--ec-storage-bytes``), one budget for every replica writing there.

vLLM's ``ECExampleConnector`` never deletes a file, so without a budget the directory grows by one file per
item for good. Here every file counts against the budget, and room for a new one is made by removing the
files least recently written or read, never one younger than ``--ec-min-age``: the age counts from the last
answer that named the file (a file already there is touched when an answer names it again), so a consumer
sent the file's hash has that long to load it. When only younger files are left, the write is refused
(``ec_cache_path: null``, counted) rather than any of them removed.

Several replicas may share the directory (Kubernetes ReadWriteMany): they keep one budget through two files
beside the items' folders, ``.mmencode-ec.lock`` (``flock``, held for each admission, touch and trim) and
``.mmencode-ec.usage`` (the directory's bytes and files, and the files admitted but not yet in place, updated
under the lock). Room is counted before a file is written, so no writer passes the budget; a trim rescans
the directory and adds the files still being written (anyone's), so what a crash or an outside hand left
uncounted is counted again then, and it frees down to 90 % of the budget, so scans are rare.

Files the chat front door has sent a request for are *pinned* until the upstream answers, and touched every
third of the minimum age meanwhile, so no replica removes them even if the upstream takes longer than the
minimum age to read them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

from mmencode.app.metrics import Metrics

__all__ = ["EC_LOCK_NAME", "EC_USAGE_NAME", "Admission", "ECStorage", "TrimReport", "Usage"]

logger = logging.getLogger("mmencode.vllm")

EC_CACHE_FILENAME = "encoder_cache.safetensors"
EC_LOCK_NAME = ".mmencode-ec.lock"
EC_USAGE_NAME = ".mmencode-ec.usage"
_LOW_WATER = 0.9  # a trim frees down to this share of the budget, so that the next one is far off
_TEMP_MAX_AGE_S = 3600.0  # a writer's temporary file this old was left by a crash
_EMPTY_GRACE_S = 60.0  # an empty folder younger than this may be a writer's, about to hold its file
_LOG_EVERY_S = 60.0
_WRITE_GRACE_S = 300.0  # a file admitted this long ago and still not in place was a writer's that died

# What an item's file needs: it is there already (and now named again), room was made for it, or there is
# none without removing a file younger than the minimum age.
Admission = Literal["present", "admitted", "refused"]


@dataclass(frozen=True, slots=True)
class Usage:
    bytes: int
    files: int


@dataclass(frozen=True, slots=True)
class TrimReport:
    before: Usage
    after: Usage
    evicted: int
    evicted_bytes: int
    young: int  # files that would have gone but were younger than the minimum age (or pinned)


@dataclass(slots=True)
class _Ledger:
    """What the usage file holds: the directory's count, and the files admitted but not yet in place (by item
    hash: their bytes and when they were admitted), which a rescan does not see on disk."""

    usage: Usage
    writing: dict[str, tuple[int, float]]


@dataclass(frozen=True, slots=True)
class _File:
    recency: float  # the later of its last write (or naming) and its last read
    size: int
    path: Path


class ECStorage:
    """The budget of one connector directory, as this process keeps it. Thread-safe; blocking I/O."""

    def __init__(self, root: Path, *, max_bytes: int, min_age_s: float, metrics: Metrics) -> None:
        self.root = root
        self.max_bytes = max_bytes  # 0: no budget (files are still counted)
        self.min_age_s = min_age_s
        self.metrics = metrics
        self._lock = threading.Lock()  # flock excludes processes; this, this process's threads
        self._pins_lock = threading.Lock()
        self._pins: Counter[str] = Counter()
        self._usage = Usage(0, 0)  # the directory's, as this process last read or wrote it
        self._refusing = False
        self._refusal_logged = 0.0
        metrics.ec_storage_bytes.set_function(lambda: float(self._usage.bytes))
        metrics.ec_storage_files.set_function(lambda: float(self._usage.files))

    @property
    def usage(self) -> Usage:
        return self._usage

    # ----- the lock and the usage file -----
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._lock, self._lock_file() as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _lock_file(self) -> IO[str]:
        try:
            return open(self.root / EC_LOCK_NAME, "a")
        except FileNotFoundError:  # the directory itself is new (or was removed): made as vLLM would
            self.root.mkdir(parents=True, exist_ok=True)
            return open(self.root / EC_LOCK_NAME, "a")

    def _ledger(self) -> _Ledger:
        """The usage file's ledger; a rescan when there is none yet, or it is unreadable."""
        try:
            saved = json.loads((self.root / EC_USAGE_NAME).read_text())
            writing = {str(key): (int(size), float(at)) for key, (size, at) in saved.get("writing", {}).items()}
            return _Ledger(Usage(int(saved["bytes"]), int(saved["files"])), writing)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return self._rescan({})[0]

    def _store(self, ledger: _Ledger) -> None:
        saved = {"bytes": ledger.usage.bytes, "files": ledger.usage.files, "writing": ledger.writing}
        temp = self.root / f"{EC_USAGE_NAME}.{os.getpid()}.tmp"
        temp.write_text(json.dumps(saved))
        os.replace(temp, self.root / EC_USAGE_NAME)
        self._usage = ledger.usage

    # ----- what the writer asks -----
    def name(self, target: Path) -> bool:
        """Touch ``target`` (an answer names it again: its minimum age starts over); False if it is gone."""
        with self._locked():
            return _touch(target)

    def admit(self, target: Path, nbytes: int) -> Admission:
        """Room for ``target``, a new file of ``nbytes``, counted now (until :meth:`written` or
        :meth:`give_back`, as a file being written), made by removing the least recently used files past the
        minimum age if the budget needs it; or refused."""
        with self._locked():
            if _touch(target):
                return "present"
            ledger = self._ledger()
            if self.max_bytes and ledger.usage.bytes + nbytes > self.max_bytes:
                ledger = self._trim(nbytes, ledger.writing)[1]
                if ledger.usage.bytes + nbytes > self.max_bytes:
                    self._store(ledger)
                    self._refused(nbytes)
                    return "refused"
            ledger.writing[target.parent.name] = (nbytes, time.time())
            ledger.usage = Usage(ledger.usage.bytes + nbytes, ledger.usage.files + 1)
            self._store(ledger)
        if self._refusing:
            self._refusing = False
            logger.info("encoder-cache storage %s has room again", self.root)
        return "admitted"

    def written(self, target: Path) -> None:
        """An admitted file is in place: counted from now on as any file is."""
        with self._locked():
            ledger = self._ledger()
            if ledger.writing.pop(target.parent.name, None) is not None:
                self._store(ledger)

    def give_back(self, target: Path) -> None:
        """An admitted file that will not be written: it leaves the count."""
        with self._locked():
            ledger = self._ledger()
            admitted = ledger.writing.pop(target.parent.name, None)
            if admitted is not None:
                size = admitted[0]
                ledger.usage = Usage(max(0, ledger.usage.bytes - size), max(0, ledger.usage.files - 1))
                self._store(ledger)

    def _refused(self, nbytes: int) -> None:
        self.metrics.ec_cache_writes.labels("refused").inc()
        self._refusing = True
        if time.monotonic() - self._refusal_logged > _LOG_EVERY_S:  # a full directory says so once a minute
            self._refusal_logged = time.monotonic()
            logger.warning(
                "encoder-cache storage %s is full: %d bytes in %d files, budget %d (--ec-storage-bytes), and none "
                "is older than --ec-min-age (%gs); refusing new files (ec_cache_path null) of %d bytes and more",
                self.root,
                self._usage.bytes,
                self._usage.files,
                self.max_bytes,
                self.min_age_s,
                nbytes,
            )

    # ----- pins: files a request in flight names -----
    def pin(self, hashes: Iterable[str]) -> None:
        with self._pins_lock:
            self._pins.update(hashes)

    def unpin(self, hashes: Iterable[str]) -> None:
        with self._pins_lock:
            self._pins.subtract(hashes)
            self._pins = +self._pins  # drop the zeros

    def pinned(self) -> set[str]:
        with self._pins_lock:
            return set(self._pins)

    # ----- scans, trims, upkeep -----
    def open(self) -> TrimReport:
        """At start: count the directory afresh, and trim it if it is over the budget (one log line then)."""
        self.root.mkdir(parents=True, exist_ok=True)
        with self._locked():
            ledger = self._rescan(self._ledger().writing)[0]
            self._store(ledger)
            if not self.max_bytes or ledger.usage.bytes <= self.max_bytes:
                return TrimReport(ledger.usage, ledger.usage, 0, 0, 0)
            report, ledger = self._trim(0, ledger.writing)
            self._store(ledger)
        logger.warning(
            "encoder-cache storage %s held %s in %d files, over its budget of %s (--ec-storage-bytes): removed %d "
            "files (%s) not named for --ec-min-age (%gs)%s",
            self.root,
            _size(report.before.bytes),
            report.before.files,
            _size(self.max_bytes),
            report.evicted,
            _size(report.evicted_bytes),
            self.min_age_s,
            f"; {report.young} younger files keep it at {_size(report.after.bytes)} until they age"
            if report.after.bytes > self.max_bytes
            else f"; {_size(report.after.bytes)} now",
        )
        return report

    def upkeep(self) -> None:
        """Every third of the minimum age: touch the pinned files (so that no replica removes them), read the
        directory's count, and trim if it is over the budget (files too young at the last trim have aged)."""
        pinned = self.pinned()
        with self._locked():
            for item_hash in pinned:
                _touch(self.root / item_hash / EC_CACHE_FILENAME)
            ledger = self._ledger()
            if self.max_bytes and ledger.usage.bytes > self.max_bytes:
                ledger = self._trim(0, ledger.writing)[1]
            self._store(ledger)

    def _scan(self) -> list[_File]:
        """Every item's file; crash leftovers (old temporary files, old empty folders) are removed on the way."""
        files: list[_File] = []
        now = time.time()
        with os.scandir(self.root) as entries:
            for entry in entries:
                if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
                    continue
                folder = Path(entry.path)
                try:
                    children = list(os.scandir(folder))
                except OSError:
                    continue
                for child in children:
                    try:
                        info = child.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if child.name == EC_CACHE_FILENAME:
                        files.append(_File(max(info.st_mtime, info.st_atime), info.st_size, Path(child.path)))
                    elif child.name.endswith(".tmp") and now - info.st_mtime > _TEMP_MAX_AGE_S:
                        with contextlib.suppress(OSError):
                            os.unlink(child.path)
                if not children:
                    # An empty folder (vLLM's consumer leaves one for a file it did not find); not one a
                    # writer has just made for the file it is about to write.
                    with contextlib.suppress(OSError):
                        if now - entry.stat(follow_symlinks=False).st_mtime > max(self.min_age_s, _EMPTY_GRACE_S):
                            folder.rmdir()
        return files

    def _rescan(self, writing: dict[str, tuple[int, float]]) -> tuple[_Ledger, list[_File]]:
        """The directory counted afresh: its files, and those still being written (admitted, not in place,
        not abandoned), which a scan cannot see."""
        files = self._scan()
        in_place = {file.path.parent.name for file in files}
        now = time.time()
        pending = {
            key: (size, at) for key, (size, at) in writing.items() if key not in in_place and now - at < _WRITE_GRACE_S
        }
        sizes = [f.size for f in files] + [size for size, _ in pending.values()]
        return _Ledger(Usage(sum(sizes), len(sizes)), pending), files

    def _trim(self, incoming: int, writing: dict[str, tuple[int, float]]) -> tuple[TrimReport, _Ledger]:
        """Under the lock: remove the least recently used files past the minimum age (not pinned) until the
        directory (files being written included) and ``incoming`` bytes fit in 90 % of the budget, or nothing
        more may go."""
        ledger, files = self._rescan(writing)
        files.sort(key=lambda f: f.recency)
        before = ledger.usage
        total, count, evicted, evicted_bytes, young = before.bytes, before.files, 0, 0, 0
        goal = self.max_bytes * _LOW_WATER - incoming
        now = time.time()
        pinned = self.pinned()
        for file in files:
            if total <= goal:
                break
            if now - file.recency < self.min_age_s or file.path.parent.name in pinned:
                young += 1
                continue
            try:
                file.path.unlink()
            except FileNotFoundError:
                pass  # gone already (an outside hand): it counts no more either way
            except OSError as exc:
                logger.warning("could not remove %s from the encoder-cache storage: %s", file.path, exc)
                continue
            else:
                evicted += 1
                evicted_bytes += file.size
            with contextlib.suppress(OSError):
                file.path.parent.rmdir()
            total -= file.size
            count -= 1
        self.metrics.ec_storage_evictions.inc(evicted)
        ledger.usage = Usage(total, count)
        return TrimReport(before, ledger.usage, evicted, evicted_bytes, young), ledger


def _touch(path: Path) -> bool:
    try:
        os.utime(path)
    except FileNotFoundError:
        return False
    except OSError:
        return path.is_file()  # another uid's file: named, if not touched
    return True


def _size(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.1f} TiB"
