"""The broker's error codes (protocol section 10) as exceptions, one class per code."""

from typing import Dict, Mapping, Optional, Type


class BrokerError(Exception):
    """A failure the broker answered: ``code`` (a protocol error code), ``message`` (for
    people; the broker never puts a secret in it) and ``retry_after_ms`` where the code has one."""

    code = "internal"

    def __init__(self, message: str, code: Optional[str] = None, retry_after_ms: Optional[int] = None):
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message
        self.retry_after_ms = retry_after_ms

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class BadRequest(BrokerError):
    """A malformed request, a missing or mistyped field, an invalid account name."""

    code = "bad_request"


class LineTooLong(BrokerError):
    """A request line over 65,536 bytes (refused here before it is sent)."""

    code = "line_too_long"


class UnknownOp(BrokerError):
    """An op this broker does not implement."""

    code = "unknown_op"


class UnsupportedVersion(BrokerError):
    """The broker speaks none of the protocol versions asked for."""

    code = "unsupported_version"


class NotFound(BrokerError):
    """No account has that name."""

    code = "not_found"


class Forbidden(BrokerError):
    """This process may not use that account, or may not run that op."""

    code = "forbidden"


class NeedsLogin(BrokerError):
    """The account holds no usable credential: run ``brokerctl login NAME``."""

    code = "needs_login"


class Unavailable(BrokerError):
    """The IdP is failing for now; ``retry_after_ms`` says when trying again may help."""

    code = "unavailable"


class Locked(BrokerError):
    """The broker is locked: run ``brokerctl unlock``."""

    code = "locked"


class Busy(BrokerError):
    """A limit of the broker was hit; retry after ``retry_after_ms``."""

    code = "busy"


class LifetimeTooShort(BrokerError):
    """The IdP grants tokens shorter than the ``min_ttl`` asked: ask for less; retrying cannot help."""

    code = "lifetime_too_short"


class Damaged(BrokerError):
    """The account's record in the broker's vault cannot be read by its release: run the release
    that wrote it, or remove the account; retrying cannot help."""

    code = "damaged"


class Internal(BrokerError):
    """The broker failed (e.g. its vault could not be saved), or sent a code this client does not know."""

    code = "internal"


class BrokerConnectionError(ConnectionError):
    """The broker could not be reached, refused as not being the user's, or did not answer in time."""


class TokenRefused(Exception):
    """Raised by a :meth:`Client.with_token` body when the resource server refused the token
    (e.g. HTTP 401): the token is rejected and the body runs once more with a fresh one."""


class UseDPoPNonce(Exception):
    """Raised by a :meth:`Client.with_dpop` body when the resource server asked for a DPoP nonce
    (RFC 9449 section 9): the body runs once more with a proof that carries ``nonce``."""

    def __init__(self, nonce: str):
        super().__init__("the resource server asked for a DPoP nonce")
        self.nonce = nonce

    @classmethod
    def check(cls, status: int, headers: Mapping[str, str]) -> None:
        """Raises when an answer of ``status`` with ``headers`` (any mapping; names are matched
        without regard to case) demands a nonce: 401, ``WWW-Authenticate: DPoP`` naming
        ``error="use_dpop_nonce"``, and a ``DPoP-Nonce`` of at most 1,024 printable characters."""
        if status != 401:
            return
        lowered = {str(name).lower(): str(value) for name, value in headers.items()}
        challenge = lowered.get("www-authenticate", "")
        nonce = lowered.get("dpop-nonce", "")
        if not challenge.lower().startswith("dpop") or 'error="use_dpop_nonce"' not in challenge:
            return
        if 0 < len(nonce) <= 1024 and all(0x21 <= ord(c) <= 0x7E and c not in '"\\' for c in nonce):
            raise cls(nonce)


ERRORS_BY_CODE: Dict[str, Type[BrokerError]] = {
    cls.code: cls
    for cls in (
        BadRequest,
        LineTooLong,
        UnknownOp,
        UnsupportedVersion,
        NotFound,
        Forbidden,
        NeedsLogin,
        Unavailable,
        Locked,
        Busy,
        LifetimeTooShort,
        Damaged,
        Internal,
    )
}


def error_from_wire(error: object) -> BrokerError:
    """The exception for an answer's ``error`` object; an unknown code becomes :class:`Internal`."""
    if not isinstance(error, dict):
        return Internal("the broker answered a failure without an error object")
    code = error.get("code")
    message = error.get("message")
    retry = error.get("retry_after_ms")
    cls = ERRORS_BY_CODE.get(code, Internal) if isinstance(code, str) else Internal
    text = message[:1000] if isinstance(message, str) else "(no message)"
    retry_after_ms = retry if isinstance(retry, int) and not isinstance(retry, bool) and retry >= 0 else None
    return cls(text, retry_after_ms=retry_after_ms)
