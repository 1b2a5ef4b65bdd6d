"""The client: one persistent connection for requests, one more per ``events()`` subscription."""

import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, TypeVar

from .connection import Connection, checked_seconds
from .errors import BrokerConnectionError, TokenRefused, UseDPoPNonce, error_from_wire
from .paths import default_socket

T = TypeVar("T")


@dataclass(frozen=True)
class Token:
    """An access token the broker served. Its repr names the account and expiry, never the token."""

    account: str
    access_token: str = field(repr=False)
    token_type: str
    expires_at: datetime
    expires_in: int
    scope: Optional[str] = None
    id_token: Optional[str] = field(default=None, repr=False)


@dataclass(frozen=True)
class Event:
    """A change of an account (protocol ``subscribe``); events never carry a token."""

    event: str
    account: str
    at: datetime
    state: Optional[str] = None
    message: Optional[str] = None
    expires_at: Optional[datetime] = None


class Client:
    """A connection to brokerd at ``socket`` (default: ``$TOKENBROKER_SOCKET``, then the
    broker's default path). Each call waits at most ``timeout`` seconds for its answer (a token
    request may wait for a refresh at the IdP). Safe to share between threads: calls take turns
    on the one connection, which is opened on first use and again after the broker closed it."""

    def __init__(self, socket: Optional[str] = None, timeout: float = 120.0):
        self.socket = socket or default_socket()
        self.timeout = checked_seconds("timeout", timeout, positive=True)
        self._connection: Optional[Connection] = None
        self._lock = threading.Lock()
        self._next_id = 1

    def close(self) -> None:
        """Closes the connection; a later call opens a new one."""
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # Operations

    def token(
        self, account: str, min_ttl: float = 30, scope: Optional[str] = None, resource: Optional[str] = None
    ) -> Token:
        """An access token of ``account`` valid for at least ``min_ttl`` seconds (the broker
        refreshes when needed); ``scope`` (space-separated) and ``resource`` (RFC 8707) ask for
        a narrower token."""
        return _token(self.request("token", **_token_fields(account, min_ttl, scope, resource)))

    def reject(
        self,
        account: str,
        access_token: str,
        min_ttl: float = 30,
        scope: Optional[str] = None,
        resource: Optional[str] = None,
    ) -> Token:
        """Reports that a resource server refused ``access_token``; returns the token to use instead."""
        if not isinstance(access_token, str):
            raise TypeError("access_token must be a string")
        fields = _token_fields(account, min_ttl, scope, resource)
        return _token(self.request("reject", access_token=access_token, **fields))

    def with_token(
        self,
        account: str,
        body: Callable[[str], T],
        min_ttl: float = 30,
        scope: Optional[str] = None,
        resource: Optional[str] = None,
    ) -> T:
        """Returns ``body(access_token)``. If ``body`` raises :class:`TokenRefused`, rejects that
        token and calls ``body`` once more with the replacement; a second refusal propagates."""
        token = self.token(account, min_ttl, scope, resource)
        try:
            return body(token.access_token)
        except TokenRefused:
            replacement = self.reject(account, token.access_token, min_ttl, scope, resource)
            return body(replacement.access_token)

    def dpop_headers(
        self, account: str, method: str, url: str, nonce: Optional[str] = None, min_ttl: float = 30
    ) -> Dict[str, str]:
        """The headers of one request of ``method`` to ``url`` under ``account``'s DPoP-bound
        token (RFC 9449): ``{"Authorization": "DPoP <token>", "DPoP": <proof>}``, the proof made
        by the broker for that request, with the resource server's ``nonce`` when it gave one.
        Make a new pair for every request: a resource server refuses a proof used twice."""
        for label, text in (("method", method), ("url", url), ("nonce", nonce)):
            if text is not None and not isinstance(text, str):
                raise TypeError(f"{label} must be a string")
        dpop = {"htm": method, "htu": url}
        if nonce is not None:
            dpop["nonce"] = nonce
        result = self.request("token", dpop=dpop, **_token_fields(account, min_ttl, None, None))
        token = _token(result)
        return {"Authorization": f"{token.token_type} {token.access_token}", "DPoP": _text(result, "dpop_proof", True)}

    def with_dpop(
        self, account: str, method: str, url: str, body: Callable[[Dict[str, str]], T], min_ttl: float = 30
    ) -> T:
        """Returns ``body(headers)`` with the headers of :meth:`dpop_headers`. If ``body`` raises
        :class:`UseDPoPNonce` (see :meth:`UseDPoPNonce.check`: the resource server answered 401
        with ``error="use_dpop_nonce"`` and a ``DPoP-Nonce``), calls ``body`` once more with a
        proof carrying that nonce; a second demand propagates."""
        try:
            return body(self.dpop_headers(account, method, url, min_ttl=min_ttl))
        except UseDPoPNonce as demand:
            return body(self.dpop_headers(account, method, url, nonce=demand.nonce, min_ttl=min_ttl))

    def status(self, account: Optional[str] = None) -> List[dict]:
        """The state of ``account``, or of every account this process may use, as the broker's
        account status objects (protocol section 9; no secrets)."""
        fields = {} if account is None else {"account": _name(account)}
        accounts = self.request("status", **fields).get("accounts")
        if not isinstance(accounts, list):
            raise BrokerConnectionError("the broker's status answer has no account list")
        return accounts

    def events(self, accounts: Optional[Sequence[str]] = None) -> "Subscription":
        """Subscribes to the events of ``accounts`` (all when ``None``) on a connection of its
        own, and returns them as an iterator, from this call on (a refused subscription raises
        here). Close it (or use ``with``) to unsubscribe."""
        request: dict = {"id": 1, "op": "subscribe"}
        if accounts is not None:
            request["accounts"] = [_name(name) for name in accounts]
        connection = Connection(self.socket, self.timeout)
        try:
            deadline = time.monotonic() + self.timeout
            connection.send(request, deadline)
            _result(connection.read_answer(deadline))
        except BaseException:
            connection.close()
            raise
        return Subscription(connection)

    def request(self, op: str, **fields: Any) -> dict:
        """Sends any op of the protocol (``add``, ``set_tokens``, ``refresh`` ...) and returns its
        result object; a failure raises the :class:`BrokerError` subclass of its code."""
        with self._lock:
            request_id = self._next_id
            self._next_id += 1
            connection = self._live_connection()
            request = {"id": request_id, "op": op}
            request.update({key: value for key, value in fields.items() if value is not None})
            deadline = time.monotonic() + self.timeout
            try:
                connection.send(request, deadline)
                while True:
                    answer = connection.read_answer(deadline)
                    if answer.get("id") == request_id and "ok" in answer:
                        return _result(answer)
                    if answer.get("id") is None and answer.get("ok") is False:
                        return _result(answer)  # about the connection itself (e.g. forbidden), then closed
            except BrokerConnectionError:
                # A late answer must not be taken for the next call's: this connection is done.
                self._connection = None
                connection.close()
                raise

    def _live_connection(self) -> Connection:
        if self._connection is not None and self._connection.closed_by_broker:
            self._connection.close()
            self._connection = None
        if self._connection is None:
            self._connection = Connection(self.socket, self.timeout)
        return self._connection


class Subscription:
    """The events of one ``subscribe``, as they happen. Iteration ends with :class:`Busy` when
    the broker drops a subscriber that reads too slowly, :class:`BrokerConnectionError` when it
    goes away."""

    def __init__(self, connection: Connection):
        self._connection = connection

    def __iter__(self) -> Iterator[Event]:
        return self

    def __next__(self) -> Event:
        while True:
            line = self._connection.read_answer(None)
            if "event" in line:
                return _event(line)
            _result(line)  # a final failure line (busy) ends the subscription

    def close(self) -> None:
        self._connection.close()

    def __enter__(self) -> "Subscription":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


def _name(account: object) -> str:
    if not isinstance(account, str):
        raise TypeError("an account name must be a string")
    return account


def _token_fields(account: str, min_ttl: float, scope: Optional[str], resource: Optional[str]) -> dict:
    for label, text in (("scope", scope), ("resource", resource)):
        if text is not None and not isinstance(text, str):
            raise TypeError(f"{label} must be a string")
    return {
        "account": _name(account),
        "min_ttl": checked_seconds("min_ttl", min_ttl),
        "scope": scope,
        "resource": resource,
    }


def _result(answer: dict) -> dict:
    if answer.get("ok") is True:
        result = answer.get("result")
        if not isinstance(result, dict):
            raise BrokerConnectionError("the broker's answer has no result object")
        return result
    raise error_from_wire(answer.get("error"))


def _timestamp(value: object) -> datetime:
    """An RFC 3339 UTC time as the broker writes it (``2026-11-23T08:30:00Z``), as an aware datetime."""
    if not isinstance(value, str):
        raise BrokerConnectionError("the broker sent a time that is not a string")
    try:
        return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    except ValueError:
        raise BrokerConnectionError(f"the broker sent an unreadable time: {value[:40]!r}") from None


def _text(result: dict, key: str, required: bool = False) -> Optional[str]:
    value = result.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise BrokerConnectionError(f"the broker's answer has no usable {key}")
    return value


def _token(result: dict) -> Token:
    expires_in = result.get("expires_in")
    if isinstance(expires_in, bool) or not isinstance(expires_in, int):
        raise BrokerConnectionError("the broker's token answer has no usable expires_in")
    return Token(
        account=_text(result, "account", required=True),
        access_token=_text(result, "access_token", required=True),
        token_type=_text(result, "token_type", required=True),
        expires_at=_timestamp(result.get("expires_at")),
        expires_in=expires_in,
        scope=_text(result, "scope"),
        id_token=_text(result, "id_token"),
    )


def _event(line: dict) -> Event:
    expires_at = line.get("expires_at")
    return Event(
        event=_text(line, "event", required=True),
        account=_text(line, "account", required=True),
        at=_timestamp(line.get("at")),
        state=_text(line, "state"),
        message=_text(line, "message"),
        expires_at=None if expires_at is None else _timestamp(expires_at),
    )
