"""The listening socket, created here so that accepted connections detect dead peers.

Granian has no option for per-connection TCP settings, but its embedded server accepts a
ready listening socket (`SocketHolder` from a file descriptor). Linux copies the listener's
SO_KEEPALIVE, TCP_KEEPIDLE/KEEPINTVL/KEEPCNT and TCP_USER_TIMEOUT onto every socket that
`accept()` returns, so setting them on the listener sets them on each connection: idle
connections are probed after 5 s, and unacknowledged data or probes abort the connection
after 15 s. Together with the 5-second SSE heartbeat, a vanished client is noticed (and its
request cancelled) within about 20 s, also while the request waits for a lane.

TCP_NODELAY is inherited the same way. Without it a streamed response stalls: the response
head and each small SSE frame are separate writes, and Nagle's algorithm holds a small
write back until the previous one is acknowledged, which a client on a kept-alive
connection delays by up to 40 ms (delayed ACK). Measured on loopback with httpx: the first
frame came ~40 ms after the head on every reused connection, against ~1 ms with it set.
"""

from __future__ import annotations

import logging
import socket

log = logging.getLogger("ninfer.server")

KEEPALIVE_IDLE_S = 5  # first probe after this much silence
KEEPALIVE_INTERVAL_S = 5
KEEPALIVE_PROBES = 3  # only decisive without TCP_USER_TIMEOUT: 5 + 3 * 5 = 20 s
USER_TIMEOUT_MS = 15_000  # unacknowledged data (or probes) for this long aborts the connection
BACKLOG = 1024


def tcp_options() -> list[tuple[int, int, int, str]]:
    """(level, option, value, name) for every option this platform's socket module knows."""
    tcp = socket.IPPROTO_TCP
    wanted = [
        (tcp, "TCP_NODELAY", 1),  # no Nagle delay between the SSE frames
        (socket.SOL_SOCKET, "SO_KEEPALIVE", 1),
        (tcp, "TCP_KEEPIDLE", KEEPALIVE_IDLE_S),
        (tcp, "TCP_KEEPALIVE", KEEPALIVE_IDLE_S),  # macOS spelling of TCP_KEEPIDLE
        (tcp, "TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
        (tcp, "TCP_KEEPCNT", KEEPALIVE_PROBES),
        (tcp, "TCP_USER_TIMEOUT", USER_TIMEOUT_MS),  # Linux
    ]
    return [
        (level, getattr(socket, name), value, name)
        for level, name, value in wanted
        if hasattr(socket, name)
    ]


def open_listener(host: str, port: int) -> socket.socket:
    """A bound, listening, non-blocking socket with the connection options set."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        applied = []
        for level, option, value, name in tcp_options():
            try:
                sock.setsockopt(level, option, value)
                applied.append(f"{name}={value}")
            except OSError as exc:  # an older kernel: serve anyway, say what is missing
                log.warning("cannot set %s on the listening socket: %s", name, exc)
        sock.bind(address)
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    log.debug("listening socket options: %s", ", ".join(applied) or "none")
    return sock
