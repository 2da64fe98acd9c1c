"""Typed dependencies: what a route needs, read from ``app.state``."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from mmencode.app.runtime import Runtime
from mmencode.app.scheduler import Scheduler

__all__ = ["ReadyScheduler", "RuntimeDep"]


# Async though they never await: FastAPI runs a plain ``def`` dependency on its thread pool, a thread
# hop (and a wait for a free thread under load) on every request for an attribute lookup.
async def get_runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


async def get_scheduler(request: Request) -> Scheduler:
    runtime: Runtime = request.app.state.runtime
    return runtime.scheduler  # raises NotReady (503) until the model is warm


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
ReadyScheduler = Annotated[Scheduler, Depends(get_scheduler)]
