"""A dask scheduler preload (``DASK_DISTRIBUTED__SCHEDULER__PRELOAD``) that answers each
worker heartbeat a second late, as a scheduler on a loaded machine does (it shares its
process and the GIL with the run), and asks for the next one at once; and that holds
its loop a moment as each result comes in, as a busy scheduler does, so that even a
fast run lasts past the workers' first heartbeats. A worker that closes at the end of
the run then has a heartbeat waiting, and its close cuts it
(tests/run/test_quiet_runs.py)."""

from __future__ import annotations

import asyncio
import time

from distributed.diagnostics.plugin import SchedulerPlugin

DELAY_S = 1.0
NEXT_HEARTBEAT_S = 0.02
RESULT_HOLD_S = 0.3


class _BusyOnResults(SchedulerPlugin):
    def transition(self, key, start, finish, *args, **kwargs):
        if finish == "memory":
            time.sleep(RESULT_HOLD_S)  # blocks the scheduler's loop, as load does


def dask_setup(scheduler) -> None:
    answer = scheduler.handlers["heartbeat_worker"]

    async def late(*args, **kwargs):
        await asyncio.sleep(DELAY_S)
        response = answer(*args, **kwargs)
        if isinstance(response, dict) and "heartbeat-interval" in response:
            response["heartbeat-interval"] = NEXT_HEARTBEAT_S
        return response

    scheduler.handlers["heartbeat_worker"] = late
    scheduler.add_plugin(_BusyOnResults())
