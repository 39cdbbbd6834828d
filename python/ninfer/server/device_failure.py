"""A fatal device error ends the process, so that a supervisor can start a fresh one.

An out-of-memory condition or a failed check fails one unit's requests and the engine
carries on (engine.py logs the recovery). A CUDA error of any other kind (an illegal address,
a launch failure, a lost device) leaves the device context broken for good: the core stops
its engine and reports `device_failure`. The server then logs the error, answers the
requests in flight with a 503 (or an error event on a started stream), stops as SIGTERM
would and exits with DEVICE_FAILURE_EXIT_STATUS. As after a crash, those requests get no
terminal request-log record. The prefix cache is not saved (engine.py): the device's
contents cannot be trusted.

Tests reach this path without a GPU through the core's test hook: with
NINFER_TEST_DEVICE_FAULT_AFTER_STEPS=N in the environment, the model step after the next N
fails as a CUDA illegal address would. The N steps count from the end of warm-up, or, with
NINFER_TEST_DEVICE_FAULT_AT_REQUEST=K as well, from the K-th request's submission: a test
that needs a request waiting when the device fails arms the fault with that request rather
than racing a step count against its client.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import Any

log = logging.getLogger("ninfer.server")

DEVICE_FAILURE_EXIT_STATUS = 1
TEST_HOOK_ENV = "NINFER_TEST_DEVICE_FAULT_AFTER_STEPS"
TEST_HOOK_AT_REQUEST_ENV = "NINFER_TEST_DEVICE_FAULT_AT_REQUEST"
# If ending the requests in flight and stopping takes longer than this, exit regardless.
EXIT_DEADLINE_S = 10.0


class DeviceFailureExit:
    """Turns the engine's device failure into a stop and a non-zero exit status."""

    def __init__(self, exit_now: Callable[[int], Any]) -> None:
        self.failed = False
        self.status = DEVICE_FAILURE_EXIT_STATUS
        self.telemetry: Any = None  # its terminal JSONL records stop once the device failed
        self._exit_now = exit_now
        self._signals: Any = None

    def arm_test_hook(self, engine: Any) -> None:
        value = os.environ.get(TEST_HOOK_ENV)
        if value is None:
            return
        core = getattr(engine, "_core", None)
        inject = getattr(core, "inject_device_fault", None)
        if inject is None:
            log.warning("%s is set but this engine has no device-fault hook", TEST_HOOK_ENV)
            return
        try:
            steps = int(value)
        except ValueError:
            log.warning("%s=%r is not a step count: ignored", TEST_HOOK_ENV, value)
            return
        at_request = os.environ.get(TEST_HOOK_AT_REQUEST_ENV, "1")
        try:
            request_number = int(at_request)
        except ValueError:
            log.warning(
                "%s=%r is not a request number: ignored", TEST_HOOK_AT_REQUEST_ENV, at_request
            )
            request_number = 1
        if request_number <= 1:
            inject(steps)
        else:
            _arm_at_submission(engine, request_number, lambda: inject(steps))
        log.warning(
            "test hook %s: the model step after the next %d (counted from request %d's "
            "submission) fails with a fatal device error",
            TEST_HOOK_ENV,
            steps,
            max(request_number, 1),
        )

    def serving(self, signals: Any) -> None:
        """The stop signals of the running server (embedded.serve's `on_signals`)."""
        self._signals = signals
        if self.failed:
            self._stop()

    def device_failed(self, message: str) -> None:
        """AsyncEngine.on_device_failure: called once, on the event loop."""
        if self.failed:
            return
        self.failed = True
        if self.telemetry is not None:
            self.telemetry.device_failed = True
        asyncio.get_running_loop().call_later(EXIT_DEADLINE_S, self._give_up)
        if self._signals is not None:
            self._stop()

    def _stop(self) -> None:
        self._signals.fail(
            f"stopping after a device failure: exiting with status {self.status} "
            "so that a supervisor can restart the server"
        )

    def _give_up(self) -> None:
        log.error("the stop after the device failure took over %g s: exiting now", EXIT_DEADLINE_S)
        self._exit_now(self.status)


def _arm_at_submission(engine: Any, request_number: int, arm: Callable[[], None]) -> None:
    """Calls `arm` once the engine has accepted its `request_number`-th request (test hook)."""
    submit = engine.submit
    accepted = 0

    def counting_submit(request: Any) -> Any:
        nonlocal accepted
        handle = submit(request)
        accepted += 1
        if accepted == request_number:
            arm()
        return handle

    engine.submit = counting_submit
