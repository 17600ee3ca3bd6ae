"""A dask scheduler preload (``DASK_DISTRIBUTED__SCHEDULER__PRELOAD``) that answers each
worker heartbeat a second late, as a scheduler on a loaded machine does (it shares its
process and the GIL with the run), and asks for the next one at once: a worker that
closes at the end of the run then nearly always has a heartbeat waiting, and its close
cuts it (tests/run/test_quiet_runs.py)."""

from __future__ import annotations

import asyncio

DELAY_S = 1.0
NEXT_HEARTBEAT_S = 0.02


def dask_setup(scheduler) -> None:
    answer = scheduler.handlers["heartbeat_worker"]

    async def late(*args, **kwargs):
        await asyncio.sleep(DELAY_S)
        response = answer(*args, **kwargs)
        if isinstance(response, dict) and "heartbeat-interval" in response:
            response["heartbeat-interval"] = NEXT_HEARTBEAT_S
        return response

    scheduler.handlers["heartbeat_worker"] = late
