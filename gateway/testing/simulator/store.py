"""The Responses API's in-memory store, as mistral.rs keeps it (findings §5d).

Pure data; ``State`` holds it under its lock and passes ``now`` (monotonic
seconds) in, so background runs finish on a clock the tests can reason about.

* ``responses``: resources kept for ``GET`` (non-streamed runs with ``store``).
* ``histories``: the conversation (message texts) kept for
  ``previous_response_id``; streamed runs keep only this, once their
  ``[DONE]`` was written, so ``GET`` of a streamed id is 404 while ``DELETE``
  of it is 200.
* ``background``: ``background: true`` runs. The real server's task runs on
  after the immediate ``queued`` answer; here a task is ``in_progress`` until
  ``ready_at`` and then completed (or failed) with the resource made when it
  was admitted. Cancel only relabels a running task ``cancelled``; when it
  ends, completion overwrites that, as in the real server.
* Unbounded and without TTL, like the real one; ``clear`` empties it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class BackgroundTask:
    queued: dict[str, Any]  # {"id","object","created_at","model",...} status set on read
    final: dict[str, Any]  # the resource once ready (completed, or failed with error)
    ready_at: float
    store: bool
    history: tuple[str, ...] | None
    cancelled: bool = False
    settled: bool = False


@dataclass(slots=True)
class ResponseStore:
    responses: dict[str, dict[str, Any]]
    histories: dict[str, tuple[str, ...]]
    background: dict[str, BackgroundTask]

    @classmethod
    def empty(cls) -> ResponseStore:
        return cls({}, {}, {})

    def clear(self) -> None:
        self.responses.clear()
        self.histories.clear()
        self.background.clear()

    def commit(
        self, response_id: str, history: tuple[str, ...] | None, resource: dict[str, Any] | None
    ) -> None:
        if resource is not None:
            self.responses[response_id] = resource
        if history is not None:
            self.histories[response_id] = history

    def settle(self, now: float) -> None:
        """Finish every background task whose time has come."""
        for task_id, task in self.background.items():
            if task.settled or now < task.ready_at:
                continue
            task.settled, task.cancelled = True, False
            # Only a completed run reaches the cache; a failed one stays a task.
            if task.store and task.final.get("status") == "completed":
                self.commit(task_id, task.history, task.final)

    def history(self, response_id: str, now: float) -> tuple[str, ...] | None:
        self.settle(now)
        return self.histories.get(response_id)

    def get(self, response_id: str, now: float) -> dict[str, Any] | None:
        self.settle(now)
        task = self.background.get(response_id)
        if task is not None:
            if task.settled:
                return task.final
            status = "cancelled" if task.cancelled else "in_progress"
            return {**_task_resource(task), "status": status}
        return self.responses.get(response_id)

    def delete(self, response_id: str, now: float) -> bool:
        self.settle(now)
        removed = self.background.pop(response_id, None) is not None
        removed = self.responses.pop(response_id, None) is not None or removed
        return self.histories.pop(response_id, None) is not None or removed

    def cancel(self, response_id: str, now: float) -> dict[str, Any] | None:
        self.settle(now)
        task = self.background.get(response_id)
        if task is None or task.settled:
            return None
        task.cancelled = True
        return {**_task_resource(task), "status": "cancelled"}


def _task_resource(task: BackgroundTask) -> dict[str, Any]:
    # BackgroundTask::to_response_resource: a bare resource, no metadata.
    q = task.queued
    keys = ("id", "object", "created_at", "model")
    return {**{k: q[k] for k in keys}, "status": q["status"], "output": []}
