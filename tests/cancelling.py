"""Shared by the cancellation tests: set ``RunOptions.terminate`` from another thread during a run."""

import threading
import time

import runtime_core as rt
from runtime_core.errors import RunTerminatedError


def cancel_at(sess, feeds, delay: float):
    """Run with the flag set ``delay`` s after the call from another thread: the seconds from
    the flag to the error, or ``None`` when the run finished before the flag was set."""
    ro = rt.RunOptions()
    set_at = []

    def fire():
        set_at.append(time.perf_counter())
        ro.terminate = True

    timer = threading.Timer(delay, fire)
    timer.start()
    try:
        sess.run(None, feeds, ro)
    except RunTerminatedError:
        ended = time.perf_counter()
        timer.join()
        return ended - set_at[0]
    finally:
        timer.cancel()
    timer.join()
    return None
