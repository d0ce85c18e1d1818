"""Scorers that attack the reward boundary, named by file path (``scorer_ref``), so this test
process never imports them: whatever they return or write reaches the driver only through the
worker protocol.

Each reads its instruction from ``solution_str`` (``<verb>:<argument>``); a plain number is the
score.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import struct
import sys
import time


class SlowReduce:
    """Pickling (or copying) an instance sleeps for an hour: a driver that unpickled or
    deep-copied a result holding one would stall."""

    def __reduce__(self):
        time.sleep(3600)
        return (SlowReduce, ())


class SlowFloat(float):
    """A float subclass with the same trap."""

    def __reduce__(self):
        time.sleep(3600)
        return (float, (1.0,))


def _worker_socket() -> socket.socket:
    """The worker's own socket to the driver (its only stream socket)."""
    for fd in range(3, 256):
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        if sock.type == socket.SOCK_STREAM:
            return sock
        sock.close()
    raise RuntimeError("no stream socket found")


def _frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def attack(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    verb, _, arg = solution_str.partition(":")
    if verb == "reduce_extra":
        return {"score": 1.0, "trap": SlowReduce()}
    if verb == "reduce_result":
        return SlowReduce()
    if verb == "float_extra":
        return {"score": 1.0, "trap": SlowFloat(1.0)}
    if verb == "float_result":
        return SlowFloat(2.5)
    if verb == "huge_frame":  # announce a frame far over the bound, then hang
        _worker_socket().sendall(struct.pack(">I", 0xFFFFFFFF))
        time.sleep(3600)
    if verb == "partial_frame":  # half a frame, then hang: the driver must not wait on it
        _worker_socket().sendall(struct.pack(">I", 100) + b"[1,")
        time.sleep(3600)
    if verb == "garbage_frame":
        _worker_socket().sendall(_frame(b"\x80\x04K\x01."))  # a pickle, not JSON
        time.sleep(3600)
    if verb == "forged":  # a well-formed frame whose result is not plain data, for this task
        task = int(arg)
        entry = [task, "ok", 1.0, "", {"x": {"$np": ["V999999999", 0]}}]
        import json

        payload = json.dumps({"results": [entry], "retire": False}).encode()
        _worker_socket().sendall(_frame(payload))
        time.sleep(3600)
    if verb == "big_result":
        return {"score": 1.0, "blob": "x" * int(arg)}
    if verb == "alloc":  # hold arg MiB while scoring
        block = bytearray(int(arg) << 20)
        return float(len(block) >> 20)
    if verb == "print":  # arg bytes to stdout through print, as many to stderr through os.write
        line = "p" * 99 + "\n"
        for _ in range(int(arg) // 100):
            print(line, end="")
        os.write(2, b"w" * int(arg))
        return 1.0
    if verb == "chatter":  # a thread that writes to stdout for ever, after the call returns
        import threading

        def chatter():
            while True:
                os.write(1, b"c" * 4096)

        threading.Thread(target=chatter, daemon=True).start()
        return 1.0
    if verb == "kill_zygote_once":  # SIGKILL the zygote, then this worker (the OOM killer's way)
        marker = arg
        if not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getppid(), signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)
        return 5.0
    if verb == "kill_zygote":  # every time
        os.kill(os.getppid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
    if verb == "stop_self":  # SIGSTOP this worker mid-call, every time
        os.kill(os.getpid(), signal.SIGSTOP)
    if verb == "sleep":
        time.sleep(float(arg))
    if verb == "pid":
        return {"score": 1.0, "pid": os.getpid(), "ppid": os.getppid()}
    if verb == "echo":
        return {"score": 1.0, "kwargs": {"ground_truth": ground_truth, "extra_info": extra_info}}
    return float(arg or verb)


def numpy_scorer(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """Imports numpy (at call time: the zygote did not), multiplies matrices, returns numpy
    values."""
    import numpy as np

    a = np.arange(256 * 256, dtype=np.float64).reshape(256, 256) / 1e4
    total = float((a @ a).trace())
    return {"score": np.float32(1.0), "total": np.float64(total), "row": np.arange(3)}


def modules(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return {"score": 1.0, "numpy": "numpy" in sys.modules}
