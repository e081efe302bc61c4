"""The serve phase of a run: the embedded local servers of its `local:` models."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace

from runner.execute import local
from runner.job.spec import Job

__all__ = ["serving"]


@contextlib.contextmanager
def serving(job: Job) -> Iterator[Job]:
    """Start the embedded local server for `local:` models for the duration of the block.

    Yields:
        The job with each `local:` model's base URL set to its server's (the job as it is
        when it has none).
    """
    if not any(m.kind == "local" for m in job.models):
        yield job
        return
    with contextlib.ExitStack() as stack:
        models = []
        for m in job.models:
            if m.kind == "local":
                server = stack.enter_context(local.LocalServer(m.model))
                m = replace(m, base_url=server.base_url)
            models.append(m)
        yield replace(job, models=tuple(models))
