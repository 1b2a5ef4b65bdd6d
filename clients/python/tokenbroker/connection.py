"""One Unix-socket connection to the broker: the server uid check, bounded line framing, deadlines."""

import json
import math
import os
import select
import socket
import struct
import time
from typing import Optional

from .errors import BrokerConnectionError, LineTooLong

# The broker refuses request lines longer than this (protocol section 2); we refuse them first.
MAXIMUM_REQUEST_LENGTH = 65536
# The longest answer line accepted, as BrokerClient's LineReader (a status of thousands of accounts fits).
MAXIMUM_ANSWER_LENGTH = 16 << 20

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class Connection:
    """A socket connected to a broker served by this user or root, checked (``SO_PEERCRED``)
    before a byte is sent: a socket another user planted, to collect what clients send, is refused."""

    def __init__(self, path: str, timeout: float):
        self.path = path
        self._buffer = bytearray()
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._socket.settimeout(timeout)
            try:
                self._socket.connect(path)
            except OSError as error:
                raise BrokerConnectionError(
                    f"the broker is not running at {path} ({error.strerror or error}); start it with brokerd"
                ) from None
            self._check_server()
        except BaseException:
            self._socket.close()
            raise

    def _check_server(self) -> None:
        try:
            raw = self._socket.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
        except OSError as error:
            raise BrokerConnectionError(
                f"cannot tell who serves the socket {self.path} ({error.strerror}); nothing was sent"
            ) from None
        _, server_uid, _ = _UCRED.unpack(raw)
        own_uid = os.getuid()
        if server_uid not in (own_uid, 0):
            raise BrokerConnectionError(
                f"refusing the socket {self.path}: it is served by uid {server_uid}, not by you "
                f"(uid {own_uid}) or root, so it is not your broker (another user may have planted it); "
                "nothing was sent. Check who owns its directory, and TOKENBROKER_SOCKET and XDG_RUNTIME_DIR"
            )

    def close(self) -> None:
        self._socket.close()

    @property
    def closed_by_broker(self) -> bool:
        """Whether the broker has closed this connection (e.g. after it sat idle for minutes)."""
        if self._socket.fileno() < 0:
            return True
        readable, _, _ = select.select([self._socket], [], [], 0)
        if not readable:
            return False
        try:
            return self._socket.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    def send(self, request: dict, deadline: float) -> None:
        """Sends ``request`` as one line by ``deadline`` (``time.monotonic()`` seconds); a
        non-finite number is refused before anything is sent."""
        try:
            line = json.dumps(request, allow_nan=False, ensure_ascii=False, separators=(",", ":")).encode()
        except ValueError as error:
            raise ValueError(f"the request cannot be sent: {error}") from None
        if len(line) > MAXIMUM_REQUEST_LENGTH:
            raise LineTooLong(f"the request is {len(line)} bytes; the broker takes at most {MAXIMUM_REQUEST_LENGTH}")
        try:
            self._socket.settimeout(max(deadline - time.monotonic(), 0.001))
            self._socket.sendall(line + b"\n")
        except socket.timeout:
            raise BrokerConnectionError("the broker did not take the request in time") from None
        except OSError as error:
            raise BrokerConnectionError(f"sending to the broker failed: {error.strerror or error}") from None

    def read_answer(self, deadline: Optional[float]) -> dict:
        """The next answer line as a JSON object; waits until ``deadline`` (``time.monotonic()``
        seconds; forever when ``None``)."""
        while True:
            newline = self._buffer.find(b"\n")
            if newline >= 0:
                line = bytes(self._buffer[:newline])
                del self._buffer[: newline + 1]
                return _decode(line)
            if len(self._buffer) > MAXIMUM_ANSWER_LENGTH:
                raise BrokerConnectionError("the broker sent a line longer than 16 MiB")
            if deadline is None:
                self._socket.settimeout(None)
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BrokerConnectionError("the broker did not answer in time")
                self._socket.settimeout(left)
            try:
                chunk = self._socket.recv(65536)
            except socket.timeout:
                raise BrokerConnectionError("the broker did not answer in time") from None
            except OSError as error:
                raise BrokerConnectionError(f"reading from the broker failed: {error.strerror or error}") from None
            if not chunk:
                raise BrokerConnectionError("the broker closed the connection")
            self._buffer += chunk


def _decode(line: bytes) -> dict:
    def refuse_constant(name: str) -> float:
        raise ValueError(f"{name} is not JSON")

    try:
        answer = json.loads(line.decode("utf-8"), parse_constant=refuse_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise BrokerConnectionError("the broker sent a line that is not JSON") from None
    if not isinstance(answer, dict):
        raise BrokerConnectionError("the broker sent a line that is not a JSON object")
    return answer


MAXIMUM_SECONDS = 10 * 365 * 24 * 3600
"""The longest span the broker takes (Bounds.maximumLifetime)."""


def checked_seconds(name: str, value: object, positive: bool = False) -> float:
    """``value`` as a finite number of seconds from 0 (above 0 when ``positive``) to
    MAXIMUM_SECONDS; raises ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds")
    low_ok = value > 0 if positive else value >= 0
    if not math.isfinite(value) or not low_ok or value > MAXIMUM_SECONDS:
        low = "above 0" if positive else "from 0"
        raise ValueError(f"{name} must be a number of seconds {low} to {MAXIMUM_SECONDS}")
    return value
