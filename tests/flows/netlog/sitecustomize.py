"""Records every network attempt of a Python process (and of the Python processes it starts).

Put this directory on ``PYTHONPATH`` and set ``PPOFLOW_NET_LOG`` to a file: an audit hook
(``sys.addaudithook``) appends one JSON line per ``socket.connect``, ``socket.sendto`` and
``socket.getaddrinfo`` event: pid, event, address family, address or host.
"""

import json
import os
import sys

_LOG = os.environ.get("PPOFLOW_NET_LOG")


def _record(event: str, family, address) -> None:
    line = {"pid": os.getpid(), "event": event, "family": family, "address": repr(address)}
    line["argv"] = " ".join(sys.argv[:2])[:200]
    with open(_LOG, "a", encoding="utf-8") as log:
        log.write(json.dumps(line) + "\n")


def _hook(event: str, args) -> None:
    try:
        if event in ("socket.connect", "socket.sendto"):
            sock, address = args[0], args[-1]
            _record(event, int(sock.family), address)
        elif event == "socket.getaddrinfo":
            _record(event, None, args[0])
    except Exception:  # a recorder must never break the process it watches
        pass


if _LOG:
    sys.addaudithook(_hook)
