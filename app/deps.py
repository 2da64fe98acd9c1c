"""Typed dependencies: what a route needs, read from ``app.state``."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from mmencode.app.runtime import Runtime
from mmencode.app.scheduler import Scheduler

__all__ = ["ReadyScheduler", "RuntimeDep"]


def get_runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


def get_scheduler(request: Request) -> Scheduler:
    return get_runtime(request).scheduler  # raises NotReady (503) until the model is warm


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
ReadyScheduler = Annotated[Scheduler, Depends(get_scheduler)]
