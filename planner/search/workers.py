"""Worker processes of the portfolio (planner.search.portfolio): forked children that take starts
from a queue and stream what they find back to the planner process as they find it.

Why not multiprocessing.Pool: a Pool costs about 10 ms to create and tear down, a start takes a
few tenths of a second on most fleets, and a Pool's results come back only when a start returns,
so a stopped start (the anytime mode) could not hand back its best plan so far. Here:

- :class:`StartWorkers` forks ``count`` children (``os.fork``: they inherit the fleet and the
  starts without copying them and import nothing); each takes the next start index from a pipe
  (4-byte records written before the fork, so a read takes exactly one) until the pipe is
  empty or the stop time (a double in shared memory, ``time.monotonic``) has passed; the
  planner may take indices from the same queue (:meth:`StartWorkers.take`) and run them itself;
- a :class:`Notice` made before the fork is a number the planner publishes and the children
  read as it grows (the portfolio's work budget);
- a child sends every result through its own pipe as a length-prefixed pickle: the snapshots of
  a start still being refined (its best plan so far) and its final result;
- the planner reads whatever has arrived (:meth:`StartWorkers.poll`) and, when it is done,
  kills the children (SIGKILL: nothing to wait for) and reaps them in a background thread.

With ``low_priority`` a child runs at the lowest CPU priority (nice :data:`WORKER_NICE`, and
SCHED_IDLE where Linux has it: it runs only on a core nothing else wants): for work the planner
stops rather than waits for. A child dies with the planner (PR_SET_PDEATHSIG on Linux; elsewhere
it notices that its parent changed) and never returns into the caller's code.
"""

from __future__ import annotations

import mmap
import os
import pickle
import selectors
import signal
import struct
import threading
import time
from typing import Callable

WORKER_NICE = 19   # worker processes run at the lowest CPU priority
_INDEX = struct.Struct("<i")    # one queued start index
_FRAME = struct.Struct("<Q")    # length of one pickled result
_STOP = struct.Struct("<d")     # the stop time, time.monotonic
_NOTICE = struct.Struct("<Qdd")  # a sequence number (odd while being written), value, final
_SEQ = struct.Struct("<Q")


def can_fork() -> bool:
    """True where worker processes can be forked (POSIX)."""
    return hasattr(os, "fork")


class Notice:
    """A number one process publishes and the processes forked after this was made read: shared
    memory, with a sequence number that is odd while it is written, so a reader retries then
    and never sees half of a value."""

    def __init__(self):
        self._mem = mmap.mmap(-1, _NOTICE.size)
        _NOTICE.pack_into(self._mem, 0, 0, 0.0, 0.0)

    def publish(self, value: float, final: bool = False) -> None:
        """Publish ``value`` (``final``: it will not change again)."""
        seq = _SEQ.unpack_from(self._mem, 0)[0]
        _SEQ.pack_into(self._mem, 0, seq + 1)
        _NOTICE.pack_into(self._mem, 0, seq + 1, value, 1.0 if final else 0.0)
        _SEQ.pack_into(self._mem, 0, seq + 2)

    def read(self) -> tuple[float, bool]:
        """The value published last, and whether it is final."""
        while True:
            seq, value, final = _NOTICE.unpack_from(self._mem, 0)
            if seq % 2 == 0 and _SEQ.unpack_from(self._mem, 0)[0] == seq:
                return value, final > 0

    def close(self) -> None:
        self._mem.close()


def _lower_priority() -> None:
    """The lowest CPU priority this process may take: nice 19, then SCHED_IDLE (Linux)."""
    try:
        os.nice(WORKER_NICE)
    except (AttributeError, OSError):   # not allowed: run at equal priority
        pass
    if hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_IDLE"):
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        except OSError:
            pass


def _die_with_parent() -> None:
    """Ask Linux to kill this process when its parent dies (prctl PR_SET_PDEATHSIG)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)   # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class StartWorkers:
    """``count`` forked children running ``run_one(index, send, should_stop)`` for each queued
    start index (module docstring). ``send(obj)`` streams ``obj`` to the planner;
    ``should_stop()`` turns true once the stop time has passed or the planner is gone;
    ``low_priority``: the children run at the lowest CPU priority (module docstring)."""

    def __init__(self, count: int, indices: list[int],
                 run_one: Callable[[int, Callable[[object], None], Callable[[], bool]], None],
                 stop_at: float, *, low_priority: bool = True):
        self._stop = mmap.mmap(-1, _STOP.size)
        _STOP.pack_into(self._stop, 0, stop_at)
        task_r, task_w = os.pipe()
        os.write(task_w, b"".join(_INDEX.pack(i) for i in indices))
        os.close(task_w)   # an empty queue then reads as end of file
        self._tasks = task_r   # the planner's end of the queue (take)
        self._low_priority = low_priority
        self.pids: list[int] = []
        self._buffers: dict[int, bytearray] = {}
        self._selector = selectors.DefaultSelector()
        parent = os.getpid()
        try:
            for _ in range(max(1, count)):
                result_r, result_w = os.pipe()
                pid = os.fork()
                if pid == 0:   # the child: never returns
                    os.close(result_r)
                    self._child(task_r, result_w, run_one, parent)
                os.close(result_w)
                self.pids.append(pid)
                self._buffers[result_r] = bytearray()
                self._selector.register(result_r, selectors.EVENT_READ)
        except BaseException:   # no fork (out of processes or memory): none left running
            self.close()
            raise

    # ------------------------------------------------------------------------ in the child

    def stop_at(self) -> float:
        return _STOP.unpack_from(self._stop, 0)[0]

    def _child(self, task_r: int, result_w: int, run_one, parent: int) -> None:
        code = 0
        try:
            _die_with_parent()
            if self._low_priority:
                _lower_priority()
            for fd in list(self._buffers):   # the other children's result pipes
                os.close(fd)

            def should_stop() -> bool:
                return time.monotonic() >= self.stop_at() or os.getppid() != parent

            def send(obj: object) -> None:
                data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
                view = memoryview(_FRAME.pack(len(data)) + data)
                while view:
                    view = view[os.write(result_w, view):]

            while not should_stop():
                record = os.read(task_r, _INDEX.size)
                if len(record) < _INDEX.size:   # the queue is empty
                    break
                run_one(_INDEX.unpack(record)[0], send, should_stop)
        except BaseException:   # the planner went away (broken pipe), a signal, a bug
            code = 1
        finally:
            os._exit(code)

    # ---------------------------------------------------------------------- in the planner

    def take(self) -> int | None:
        """The next queued index for the planner to run itself; None when the queue is empty."""
        if self._tasks < 0:
            return None
        record = os.read(self._tasks, _INDEX.size)
        return _INDEX.unpack(record)[0] if len(record) == _INDEX.size else None

    def set_stop(self, stop_at: float) -> None:
        """Move the stop time (time.monotonic) the children obey."""
        _STOP.pack_into(self._stop, 0, stop_at)

    @property
    def running(self) -> bool:
        """True while some child may still send something."""
        return bool(self._buffers)

    def poll(self, timeout: float = 0.0) -> list[object]:
        """Everything the children sent that has arrived, waiting at most ``timeout`` seconds
        for the first of it (0: no wait)."""
        out: list[object] = []
        deadline = time.monotonic() + max(0.0, timeout)
        while self._buffers:
            wait = deadline - time.monotonic()
            events = self._selector.select(max(0.0, wait) if not out else 0)
            if not events:
                break
            for key, _ in events:
                fd = key.fd
                chunk = os.read(fd, 1 << 20)
                if not chunk:   # the child is done
                    self._selector.unregister(fd)
                    os.close(fd)
                    del self._buffers[fd]
                    continue
                buf = self._buffers[fd]
                buf += chunk
                while len(buf) >= _FRAME.size:
                    size = _FRAME.unpack_from(buf, 0)[0]
                    if len(buf) < _FRAME.size + size:
                        break
                    out.append(pickle.loads(bytes(buf[_FRAME.size:_FRAME.size + size])))
                    del buf[:_FRAME.size + size]
        return out

    def close(self) -> None:
        """Kill the children (they hold nothing worth waiting for) and reap them in the
        background; close the pipes."""
        for fd in list(self._buffers):
            self._selector.unregister(fd)
            os.close(fd)
        self._buffers.clear()
        self._selector.close()
        if self._tasks >= 0:
            os.close(self._tasks)
            self._tasks = -1
        pids, self.pids = self.pids, []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if pids:
            threading.Thread(target=_reap, args=(pids,), name="portfolio-reaper",
                             daemon=True).start()
        self._stop.close()


def _reap(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def wait_reaped(timeout: float = 5.0) -> None:
    """Wait until the killed children of every closed StartWorkers are reaped (a benchmark
    counting the children's CPU seconds calls it after its timed part)."""
    deadline = time.monotonic() + timeout
    for thread in threading.enumerate():
        if thread.name == "portfolio-reaper":
            thread.join(max(0.0, deadline - time.monotonic()))
