"""tokenbroker: get OAuth access tokens from brokerd, the per-user token broker, over its Unix socket.

>>> import tokenbroker
>>> client = tokenbroker.Client()
>>> token = client.token("github", min_ttl=60)
>>> token.access_token, token.expires_at
"""

from .client import Client, Event, Subscription, Token
from .errors import (
    BadRequest,
    BrokerConnectionError,
    BrokerError,
    Busy,
    Damaged,
    Forbidden,
    Internal,
    LifetimeTooShort,
    LineTooLong,
    Locked,
    NeedsLogin,
    NotFound,
    TokenRefused,
    UnknownOp,
    UseDPoPNonce,
    Unavailable,
    UnsupportedVersion,
)
from .paths import default_socket

__all__ = [
    "BadRequest",
    "BrokerConnectionError",
    "BrokerError",
    "Busy",
    "Client",
    "Damaged",
    "Event",
    "Forbidden",
    "Internal",
    "LifetimeTooShort",
    "LineTooLong",
    "Locked",
    "NeedsLogin",
    "NotFound",
    "Subscription",
    "Token",
    "TokenRefused",
    "UnknownOp",
    "UseDPoPNonce",
    "Unavailable",
    "UnsupportedVersion",
    "default_socket",
]
