"""DPoP (RFC 9449) test support: a strict ES256 proof verifier, a DPoP token endpoint and a
DPoP-protected resource server, both real HTTP servers on 127.0.0.1.

Verifying needs python3-cryptography (Debian's ``python3-cryptography``; scripts/install-deps
installs it). Nothing here prints or logs a token or a proof.
"""

import base64
import binascii
import hashlib
import http.client
import json
import secrets
import threading
import time
import urllib.parse
from typing import Dict, List, Optional, Sequence, Tuple

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature, encode_dss_signature

import tokenbroker

from .support import LocalHTTPServer, QuietHandler, add_oauth2_account

_BASE64URL_ALPHABET = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def b64url(data: bytes) -> str:
    """base64url without padding (RFC 7515 section 2)."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> Optional[bytes]:
    """Strict base64url without padding; ``None`` for any other character, padding included."""
    if not isinstance(text, str) or not text or not set(text) <= _BASE64URL_ALPHABET or len(text) % 4 == 1:
        return None
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None


def sha256_b64url(text: str) -> str:
    """base64url(SHA-256(text)): the ``ath`` of an access token."""
    return b64url(hashlib.sha256(text.encode()).digest())


def thumbprint(x: str, y: str) -> str:
    """The RFC 7638 SHA-256 thumbprint of the P-256 key (``x``, ``y`` base64url): its required
    members in lexical order, no whitespace."""
    return sha256_b64url(f'{{"crv":"P-256","kty":"EC","x":"{x}","y":"{y}"}}')


def normalised_url(url: str) -> Optional[Tuple[str, bool]]:
    """``url`` as scheme://host[:port]/path, scheme and host lowercase, the default port dropped,
    an empty path ``/``; and whether it had a query or fragment. ``None`` unless absolute http(s)
    without user information."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname or parts.username is not None:
        return None
    default = 80 if scheme == "http" else 443
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    port_text = "" if port in (None, default) else f":{port}"
    base = f"{scheme}://{host}{port_text}{parts.path or '/'}"
    return base, bool(parts.query or parts.fragment or url.endswith(("?", "#")))


class DPoPRefusal(Exception):
    """Why a proof was refused: one stable reason per check of RFC 9449 section 4.3."""

    def __init__(self, reason: str):
        super().__init__(f"DPoP proof refused: {reason}")
        self.reason = reason


class DPoPVerifier:
    """Checks DPoP proofs as an authorization or resource server must (RFC 9449 section 4.3),
    ES256 only, remembering the ``jti`` of each proof it accepted (section 11.1)."""

    MAXIMUM_SIZE = 8192

    def __init__(self, window: float = 60):
        self.window = window
        self._seen = set()
        self._lock = threading.Lock()

    def verify(
        self,
        proofs: Sequence[str],
        method: str,
        url: str,
        now: Optional[float] = None,
        access_token: Optional[str] = None,
        nonce: Optional[str] = None,
        bound_to: Optional[str] = None,
    ) -> Tuple[str, dict]:
        """Verifies the values of a request's ``DPoP`` headers (exactly one proof) for ``method``
        to ``url``; ``access_token`` demands its ``ath``, ``nonce`` that nonce, ``bound_to`` a key
        of that thumbprint. Returns the key's thumbprint and the proof's claims."""
        if not proofs:
            raise DPoPRefusal("missing")
        if len(proofs) != 1:
            raise DPoPRefusal("multiple")
        proof = proofs[0]
        if len(proof.encode()) > self.MAXIMUM_SIZE:
            raise DPoPRefusal("too_large")
        if not proof:
            raise DPoPRefusal("missing")
        if "," in proof:
            raise DPoPRefusal("multiple")
        parts = proof.split(".")
        header = _json_object(parts[0]) if len(parts) == 3 else None
        if header is None:
            raise DPoPRefusal("malformed")
        if header.get("typ") != "dpop+jwt":
            raise DPoPRefusal("typ")
        if header.get("alg") != "ES256":
            raise DPoPRefusal("alg")
        jwk = header.get("jwk")
        if not isinstance(jwk, dict):
            raise DPoPRefusal("jwk")
        if "d" in jwk:
            raise DPoPRefusal("jwk_private")
        x_bytes, y_bytes = b64url_decode(jwk.get("x")), b64url_decode(jwk.get("y"))
        if jwk.get("kty") != "EC" or jwk.get("crv") != "P-256" or x_bytes is None or y_bytes is None:
            raise DPoPRefusal("jwk")
        if len(x_bytes) != 32 or len(y_bytes) != 32:
            raise DPoPRefusal("jwk")
        try:
            numbers = ec.EllipticCurvePublicNumbers(
                int.from_bytes(x_bytes, "big"), int.from_bytes(y_bytes, "big"), ec.SECP256R1()
            )
            key = numbers.public_key()  # refuses a point not on the curve
        except ValueError:
            raise DPoPRefusal("jwk") from None
        signature = b64url_decode(parts[2])
        if signature is None or len(signature) != 64:
            raise DPoPRefusal("signature")
        der = encode_dss_signature(int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big"))
        try:
            key.verify(der, f"{parts[0]}.{parts[1]}".encode("ascii"), ec.ECDSA(hashes.SHA256()))
        except InvalidSignature:
            raise DPoPRefusal("signature") from None

        claims = _json_object(parts[1])
        if claims is None:
            raise DPoPRefusal("malformed")
        jti = claims.get("jti")
        if not isinstance(jti, str) or len(jti) < 16:
            raise DPoPRefusal("jti")
        if claims.get("htm") != method:
            raise DPoPRefusal("htm")
        htu = claims.get("htu")
        claimed = normalised_url(htu) if isinstance(htu, str) else None
        requested = normalised_url(url)
        if claimed is None or claimed[1] or requested is None or claimed[0] != requested[0]:
            raise DPoPRefusal("htu")
        iat = claims.get("iat")
        now = time.time() if now is None else now
        if isinstance(iat, bool) or not isinstance(iat, int) or abs(iat - now) > self.window:
            raise DPoPRefusal("iat")
        if access_token is not None and claims.get("ath") != sha256_b64url(access_token):
            raise DPoPRefusal("ath")
        if nonce is not None and claims.get("nonce") != nonce:
            raise DPoPRefusal("nonce")
        # Of the key's bytes, not of the text sent.
        jkt = thumbprint(b64url(x_bytes), b64url(y_bytes))
        if bound_to is not None and jkt != bound_to:
            raise DPoPRefusal("jkt")
        with self._lock:
            if jti in self._seen:
                raise DPoPRefusal("replayed")
            self._seen.add(jti)
        return jkt, claims


def _json_object(part: str) -> Optional[dict]:
    data = b64url_decode(part)
    if data is None:
        return None
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class TestSigner:
    """A P-256 key of the test's own, making proofs as a DPoP client would: for testing the
    verifier itself (the broker's proofs are made by the broker)."""

    def __init__(self):
        self.key = ec.generate_private_key(ec.SECP256R1())
        numbers = self.key.public_key().public_numbers()
        self.jwk = {
            "kty": "EC",
            "crv": "P-256",
            "x": b64url(numbers.x.to_bytes(32, "big")),
            "y": b64url(numbers.y.to_bytes(32, "big")),
        }
        self.thumbprint = thumbprint(self.jwk["x"], self.jwk["y"])

    def proof(self, method: str, url: str, header: Optional[dict] = None, **claims) -> str:
        """A signed proof; ``header`` and ``claims`` override the defaults (a value of ``None``
        drops that member)."""
        full_header = {"typ": "dpop+jwt", "alg": "ES256", "jwk": self.jwk, **(header or {})}
        payload = {"jti": b64url(secrets.token_bytes(16)), "htm": method, "htu": url, "iat": int(time.time()), **claims}
        full_header = {k: v for k, v in full_header.items() if v is not None}
        payload = {k: v for k, v in payload.items() if v is not None}
        signing_input = (
            b64url(json.dumps(full_header, separators=(",", ":")).encode())
            + "."
            + b64url(json.dumps(payload, separators=(",", ":")).encode())
        )
        r, s = decode_dss_signature(self.key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256())))
        return signing_input + "." + b64url(r.to_bytes(32, "big") + s.to_bytes(32, "big"))


class DPoPIdP:
    """An OAuth2 token endpoint on 127.0.0.1 in DPoP mode, for a public client (``client_id``
    in the form, no secret): every request needs one valid proof for ``POST`` to its token URL
    (400 ``invalid_dpop_proof`` else); with ``require_nonce``, a proof without the current nonce
    is answered 400 ``use_dpop_nonce`` with a ``DPoP-Nonce`` header. It rotates refresh tokens
    and issues ``token_type: DPoP`` tokens, each access and refresh token bound to the proof's
    key (a refresh with another key is ``invalid_grant``)."""

    def __init__(self, lifetime: int = 3600, require_nonce: bool = False):
        self.lifetime = lifetime
        self.client_id = "py-dpop-client"
        self.refresh_token = "rt-" + secrets.token_hex(12)
        self.nonce: Optional[str] = b64url(secrets.token_bytes(16)) if require_nonce else None
        self.verifier = DPoPVerifier()
        self.refreshes = 0
        self.issued: List[str] = []
        self.presented: List[str] = []
        self.refusals: List[str] = []
        self.proof_nonces: List[Optional[str]] = []
        self.access_bindings: Dict[str, str] = {}
        self.refresh_bindings: Dict[str, str] = {}
        self._expiry: Dict[str, float] = {}
        self._lock = threading.Lock()
        idp = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                status, body, headers = idp.answer(self.path, self.headers.get_all("DPoP") or [], self.form())
                data = json.dumps(body).encode()
                self.send_answer(status, data, [("Content-Type", "application/json"), *headers])

        self.http = LocalHTTPServer(Handler)
        self.token_endpoint = self.http.base_url + "/token"

    def rotate_nonce(self) -> None:
        with self._lock:
            self.nonce = b64url(secrets.token_bytes(16))

    def answer(self, path: str, proofs: List[str], form: dict) -> tuple:
        with self._lock:
            nonce_headers = [("DPoP-Nonce", self.nonce)] if self.nonce else []
            if path != "/token":
                return 404, {"error": "not_found"}, []
            try:
                jkt, claims = self.verifier.verify(proofs, "POST", self.token_endpoint, nonce=self.nonce)
            except DPoPRefusal as refusal:
                self.refusals.append(refusal.reason)
                code = "use_dpop_nonce" if refusal.reason == "nonce" else "invalid_dpop_proof"
                return 400, {"error": code, "error_description": str(refusal)}, nonce_headers
            self.proof_nonces.append(claims.get("nonce"))
            if form.get("client_id") != [self.client_id] or "client_secret" in form:
                return 401, {"error": "invalid_client"}, nonce_headers
            presented = form.get("refresh_token", [""])[0]
            self.presented.append(presented)
            if form.get("grant_type") != ["refresh_token"] or presented != self.refresh_token:
                return 400, {"error": "invalid_grant"}, nonce_headers
            bound = self.refresh_bindings.get(presented)
            if bound is not None and bound != jkt:
                self.refusals.append("jkt")
                return 400, {"error": "invalid_grant"}, nonce_headers
            self.refreshes += 1
            self.refresh_token = "rt-" + secrets.token_hex(12)
            access_token = f"at-dpop-{self.refreshes}-" + secrets.token_hex(8)
            self.issued.append(access_token)
            self.access_bindings[access_token] = jkt
            self.refresh_bindings[self.refresh_token] = jkt
            self._expiry[access_token] = time.time() + self.lifetime
            body = {
                "access_token": access_token,
                "token_type": "DPoP",
                "expires_in": self.lifetime,
                "refresh_token": self.refresh_token,
                "scope": "items",
            }
            return 200, body, nonce_headers

    def accepted(self, access_token: str) -> bool:
        """Whether this IdP issued ``access_token`` and it has not expired."""
        with self._lock:
            return self._expiry.get(access_token, 0) > time.time()

    def bound_thumbprint(self, access_token: str) -> Optional[str]:
        with self._lock:
            return self.access_bindings.get(access_token)

    def secrets(self) -> List[str]:
        """Every refresh token it issued or was shown: never to be printed or logged."""
        with self._lock:
            return [self.refresh_token] + [p for p in self.presented if p] + list(self.refresh_bindings)

    def add_account(self, client: tokenbroker.Client, account: str) -> None:
        """Adds an ``oauth2`` account with ``dpop = "ES256"`` holding the current refresh token."""
        add_oauth2_account(client, account, self, dpop="ES256")

    def stop(self) -> None:
        self.http.stop()


class ResourceRefusal(Exception):
    """Why the resource server refused a request: its RFC 6750 ``error`` (``None``: no
    credentials at all) and the reason recorded (a :class:`DPoPRefusal` reason for a proof)."""

    def __init__(self, error: Optional[str], reason: str):
        super().__init__(f"{error}: {reason}")
        self.error = error
        self.reason = reason


def _claims_unverified(proof: str) -> dict:
    parts = proof.split(".")
    return (_json_object(parts[1]) or {}) if len(parts) == 3 else {}


class DPoPResourceServer:
    """A protected resource on 127.0.0.1 taking ``idp``'s DPoP-bound tokens as RFC 9449
    section 7 says: ``Authorization: DPoP <token>`` of a token ``idp`` issued and still holds
    valid, and one proof for this request's method and URL, with the token's ``ath``, signed by
    the key the token is bound to, never seen before (and carrying this server's nonce when
    ``require_nonce``). ``GET /items`` (and ``POST /items``) answer 200 ``{"ok":true}``; a
    refusal is 401 with a ``WWW-Authenticate: DPoP`` challenge, its reason recorded."""

    def __init__(self, idp: DPoPIdP, require_nonce: bool = False):
        self.idp = idp
        self.nonce: Optional[str] = b64url(secrets.token_bytes(16)) if require_nonce else None
        self.verifier = DPoPVerifier()
        self.successes = 0
        self.refusals: List[str] = []
        self.proof_nonces: List[Optional[str]] = []  # the nonce claim of each lone proof presented
        self._lock = threading.Lock()
        server = self

        class Handler(QuietHandler):
            def handle_request(self) -> None:
                status, headers = server.answer(self.command, self.path, self.headers)
                body = b'{"ok":true}' if status == 200 else b""
                self.send_answer(status, body, [("Content-Type", "application/json"), *headers])

            do_GET = handle_request
            do_POST = handle_request

        self.http = LocalHTTPServer(Handler)
        self.base_url = self.http.base_url
        self.url = self.base_url + "/items"

    def rotate_nonce(self) -> None:
        """Issues a new nonce (only while one is demanded): proofs with the old one are refused."""
        with self._lock:
            self.nonce = b64url(secrets.token_bytes(16))

    def answer(self, method: str, path: str, headers) -> Tuple[int, List[Tuple[str, str]]]:
        with self._lock:
            nonce = self.nonce
        nonce_headers = [("DPoP-Nonce", nonce)] if nonce else []
        if urllib.parse.urlsplit(path).path != "/items":
            return 404, []
        proofs = headers.get_all("DPoP") or []
        if len(proofs) == 1:
            with self._lock:
                self.proof_nonces.append(_claims_unverified(proofs[0]).get("nonce"))
        try:
            self._authorize(method, self.base_url + path, headers.get_all("Authorization") or [], proofs, nonce)
        except ResourceRefusal as refusal:
            with self._lock:
                self.refusals.append(refusal.reason)
            error = refusal.error
            challenge = f'DPoP error="{error}", algs="ES256"' if error else 'DPoP algs="ES256"'
            extra = nonce_headers if error == "use_dpop_nonce" else []
            return (400 if error == "invalid_request" else 401), [("WWW-Authenticate", challenge), *extra]
        with self._lock:
            self.successes += 1
        return 200, nonce_headers

    def _authorize(
        self, method: str, url: str, authorizations: List[str], proofs: List[str], nonce: Optional[str]
    ) -> None:
        """Returns when the request may have the resource."""
        if not authorizations:
            raise ResourceRefusal(None, "no_token")
        parts = authorizations[0].split(" ", 1)
        if len(authorizations) != 1 or len(parts) != 2:
            raise ResourceRefusal("invalid_request", "authorization")
        scheme, token = parts[0].lower(), parts[1]
        if not self.idp.accepted(token):
            raise ResourceRefusal("invalid_token", "token")
        bound = self.idp.bound_thumbprint(token)
        if scheme == "bearer":
            if bound is not None:
                raise ResourceRefusal("invalid_token", "bearer")
            return
        if scheme != "dpop":
            raise ResourceRefusal("invalid_request", "scheme")
        if bound is None:
            raise ResourceRefusal("invalid_token", "unbound")
        try:
            self.verifier.verify(proofs, method, url, access_token=token, nonce=nonce, bound_to=bound)
        except DPoPRefusal as refusal:
            error = "use_dpop_nonce" if refusal.reason == "nonce" else "invalid_dpop_proof"
            raise ResourceRefusal(error, refusal.reason) from None

    def stop(self) -> None:
        self.http.stop()


def send(
    method: str, url: str, headers: Sequence[Tuple[str, str]] = (), form: Optional[dict] = None
) -> Tuple[int, Dict[str, str]]:
    """Sends one request (no proxy, no redirect) with ``headers`` (repeats allowed) and ``form``
    as an urlencoded body; returns the status and the answer's headers."""
    parts = urllib.parse.urlsplit(url)
    body = urllib.parse.urlencode(form).encode() if form is not None else None
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        connection.putrequest(method, parts.path + (f"?{parts.query}" if parts.query else ""))
        for name, value in headers:
            connection.putheader(name, value)
        if body is not None:
            connection.putheader("Content-Type", "application/x-www-form-urlencoded")
            connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        response.read()
        return response.status, dict(response.getheaders())
    finally:
        connection.close()
