"""Runs inside a sandbox whose only way out is the daemon's egress proxy: listens on
127.0.0.1:PORT of the sandbox's own loopback, relays each connection to the proxy's Unix
socket, runs the command, and exits as it does (128 + N when a signal N killed it).
Standard library only (run as `python -I -S forward.py SOCKET PORT -- COMMAND...`); imports
nothing of ours, nothing imports it; exports nothing.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading


def _pipe(source: socket.socket, dest: socket.socket, done: threading.Semaphore) -> None:
    try:
        while data := source.recv(65536):
            dest.sendall(data)
    except OSError:
        pass
    try:
        dest.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    if not done.acquire(blocking=False):  # the second direction to end closes both
        source.close()
        dest.close()


def _serve(listener: socket.socket, path: str) -> None:
    while True:
        client, _ = listener.accept()
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(path)
        except OSError:
            client.close()
            upstream.close()
            continue
        done = threading.Semaphore(1)
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pipe, args=(a, b, done), daemon=True).start()


def main(argv: list[str]) -> int:
    path, port, separator, *command = argv
    if separator != "--" or not command:
        print("usage: forward.py SOCKET PORT -- COMMAND...", file=sys.stderr)
        return 2
    listener = socket.create_server(("127.0.0.1", int(port)))
    threading.Thread(target=_serve, args=(listener, path), daemon=True).start()
    child = subprocess.Popen(command)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda number, _frame: child.send_signal(number))
    code = child.wait()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
