"""Stopping on signals cannot deadlock: a handler never takes the stop event's lock itself.

A Python signal handler runs in the main thread between two bytecodes. The worker and the
following commands used to call ``stop.set()`` from their handlers, which hangs forever when the
main thread already holds the event's lock: a second signal arriving while the first handler is
inside ``set()`` (Ctrl-C to the process group, then the SIGTERM the worker's parent sends), or a
signal arriving while the main thread is inside ``stop.wait()``. Each case runs in its own
interpreter so that a deadlock fails the test instead of hanging the suite.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

CASES = {
    # The first handler's set() holds the lock when the second signal's handler runs.
    "second_signal_inside_the_first_handler": """
        import os, signal, threading
        from fencepost.cli._common import stop_on_signals
        with stop_on_signals() as stop:
            lock = stop._cond
            with lock:  # what Event.set holds while the next signal's handler runs
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(1000):  # give the interpreter bytecodes to run the handler at
                    pass
            assert stop.wait(5), "the stop request was lost"
        print("stopped")
    """,
    # The worker process's own handlers (SIGINT then SIGTERM), the same way.
    "worker_handlers": """
        import os, signal, threading
        from fencepost.cli._common import StopRelay
        stop = threading.Event()
        relay = StopRelay(stop)
        signal.signal(signal.SIGTERM, relay.trigger)
        signal.signal(signal.SIGINT, relay.trigger)
        with stop._cond:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):
                pass
        assert stop.wait(5), "the stop request was lost"
        print("stopped")
    """,
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_signal_while_the_stop_events_lock_is_held_stops_instead_of_deadlocking(case):
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(CASES[case])], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "stopped"


def test_the_relay_ends_its_thread_when_closed():
    import threading

    from fencepost.cli._common import StopRelay

    stop = threading.Event()
    relay = StopRelay(stop)
    relay.trigger()
    assert stop.wait(5)
    relay.close()
    assert not relay._thread.is_alive()
    relay.trigger()  # after close: ignored, never raises
