"""SingleFlight: one task per key at a time; joiners share its result or error; one caller's
cancellation never cancels the work for the others; a finished key starts afresh."""

from __future__ import annotations

import asyncio

import pytest

from gateway.errors import APIError, invalid
from gateway.media.single_flight import SingleFlight


def test_concurrent_callers_share_one_task_and_a_later_call_starts_another() -> None:
    """Invariant: N concurrent calls for one key run the factory once; after it finishes,
    the next call runs it again (results are not memoised)."""

    async def main() -> None:
        flight: SingleFlight[str, int] = SingleFlight()
        gate = asyncio.Event()
        runs = 0

        async def work() -> int:
            nonlocal runs
            runs += 1
            await gate.wait()
            return runs

        callers = [asyncio.ensure_future(flight.run("k", work)) for _ in range(5)]
        await asyncio.sleep(0)
        assert len(flight) == 1
        gate.set()
        assert await asyncio.gather(*callers) == [1] * 5
        assert (flight.started, flight.joined, len(flight)) == (1, 4, 0)
        assert await flight.run("k", work) == 2

    asyncio.run(main())


def test_a_cancelled_caller_does_not_cancel_the_others() -> None:
    """Invariant: the shared task is shielded from any one caller's cancellation."""

    async def main() -> None:
        flight: SingleFlight[str, str] = SingleFlight()
        gate = asyncio.Event()

        async def work() -> str:
            await gate.wait()
            return "done"

        first = asyncio.ensure_future(flight.run("k", work))
        second = asyncio.ensure_future(flight.run("k", work))
        await asyncio.sleep(0)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        gate.set()
        assert await second == "done"

    asyncio.run(main())


def test_each_caller_gets_its_own_copy_of_an_api_error() -> None:
    """Invariant: callers may set `param` on the error they get without affecting others."""

    async def main() -> None:
        flight: SingleFlight[str, str] = SingleFlight()
        gate = asyncio.Event()

        async def work() -> str:
            await gate.wait()
            raise invalid("bad image")

        callers = [asyncio.ensure_future(flight.run("k", work)) for _ in range(2)]
        await asyncio.sleep(0)
        gate.set()
        errors = await asyncio.gather(*callers, return_exceptions=True)
        assert all(isinstance(e, APIError) and e.message == "bad image" for e in errors)
        assert errors[0] is not errors[1]
        errors[0].param = "a"
        assert errors[1].param is None

    asyncio.run(main())


def test_cancel_all_cancels_running_work() -> None:
    """Invariant: cancel_all cancels every running task and leaves no key behind."""

    async def main() -> None:
        flight: SingleFlight[str, None] = SingleFlight()
        started = asyncio.Event()

        async def forever() -> None:
            started.set()
            await asyncio.Event().wait()

        caller = asyncio.ensure_future(flight.run("k", forever))
        await started.wait()
        await flight.cancel_all()
        with pytest.raises(asyncio.CancelledError):
            await caller
        assert len(flight) == 0

    asyncio.run(main())
