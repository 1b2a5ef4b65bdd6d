"""A stand-in for the IdPs and APIs the README and docs/install.md name, for scripts/test-docs.

It serves, on 127.0.0.1 at a free port (printed as the first line of stdout):
an OpenID discovery document under any path (the README's issuer path kept as it is), the
device authorization grant (RFC 8628) with a verification page that approves a code given as
`?user_code=CODE&decision=approve` (what scripts/test-docs does in place of a person), a token
endpoint at any path ending in /token (device codes and refresh tokens, rotated; the README's
`rt-from-your-login` with the client secret `s3cret` is the first), a revocation endpoint, and
any other GET as an API that answers 200 to a bearer token it issued (or the README's static
`hello-token`) and 401 to anything else. Python's standard library only.
"""

import base64
import http.server
import json
import secrets
import sys
import threading
import time
import urllib.parse

lock = threading.Lock()
refresh_tokens = {"rt-from-your-login": "s3cret"}  # refresh token -> the client secret it needs (or None)
access_tokens = {"hello-token"}
devices = {}  # device code -> {"user_code", "scope", "approved", "used"}


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def issue(scope, client_secret, id_token):
    """A token answer: a new access token and refresh token (the refresh token bound to the secret)."""
    access, refresh = "at-" + secrets.token_hex(8), "rt-" + secrets.token_hex(8)
    access_tokens.add(access)
    refresh_tokens[refresh] = client_secret
    answer = {"access_token": access, "token_type": "Bearer", "expires_in": 3600, "refresh_token": refresh}
    if scope:
        answer["scope"] = scope
    if id_token:
        payload = {"iss": "docs-idp", "sub": "user-1", "exp": int(time.time()) + 3600}
        answer["id_token"] = b64url(b'{"alg":"none","typ":"JWT"}') + "." + b64url(json.dumps(payload).encode()) + "."
    return answer


class Handler(http.server.BaseHTTPRequestHandler):
    def answer(self, status, body):
        data = json.dumps(body).encode() if not isinstance(body, str) else body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json" if not isinstance(body, str) else "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def base(self):
        return "http://" + self.headers.get("Host", "127.0.0.1")

    def client_secret(self, form):
        header = self.headers.get("Authorization", "")
        if header.startswith("Basic "):
            _, _, secret = base64.b64decode(header[6:]).decode().partition(":")
            return urllib.parse.unquote(secret)
        return form.get("client_secret")

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        suffix = "/.well-known/openid-configuration"
        if url.path.endswith(suffix):
            base = self.base()
            return self.answer(200, {
                "issuer": base + url.path[: -len(suffix)], "token_endpoint": base + "/token",
                "device_authorization_endpoint": base + "/device/code", "revocation_endpoint": base + "/revoke",
                "grant_types_supported": ["refresh_token", "urn:ietf:params:oauth:grant-type:device_code"],
            })
        if url.path == "/device":
            with lock:
                device = next((d for d in devices.values() if d["user_code"] == query.get("user_code")), None)
                if device is None:
                    return self.answer(404, "unknown code")
                if query.get("decision") == "approve":
                    device["approved"] = True
                    return self.answer(200, "approved")
            return self.answer(200, "enter the code")
        bearer = self.headers.get("Authorization", "").removeprefix("Bearer ")
        with lock:
            known = bearer in access_tokens
        self.answer(200, {"path": url.path}) if known else self.answer(401, "no valid bearer token")

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        form = dict(urllib.parse.parse_qsl(self.rfile.read(length).decode()))
        path = urllib.parse.urlsplit(self.path).path
        with lock:
            if path == "/device/code":
                device_code, user_code = secrets.token_hex(16), secrets.token_hex(2).upper() + "-" + secrets.token_hex(2).upper()
                devices[device_code] = {"user_code": user_code, "scope": form.get("scope"), "approved": False, "used": False}
                base = self.base()
                return self.answer(200, {
                    "device_code": device_code, "user_code": user_code, "verification_uri": base + "/device",
                    "verification_uri_complete": base + "/device?user_code=" + user_code,
                    "expires_in": 600, "interval": 1,
                })
            if path == "/revoke":
                refresh_tokens.pop(form.get("token"), None)
                access_tokens.discard(form.get("token"))
                return self.answer(200, {})
            if not path.endswith("/token"):
                return self.answer(404, {"error": "not_found"})
            grant = form.get("grant_type")
            if grant == "urn:ietf:params:oauth:grant-type:device_code":
                device = devices.get(form.get("device_code"))
                if device is None or device["used"]:
                    return self.answer(400, {"error": "invalid_grant"})
                if not device["approved"]:
                    return self.answer(400, {"error": "authorization_pending"})
                device["used"] = True
                scope = device["scope"] or ""
                return self.answer(200, issue(scope, None, "openid" in scope.split()))
            if grant == "refresh_token":
                token = form.get("refresh_token")
                if token not in refresh_tokens or refresh_tokens[token] not in (None, self.client_secret(form)):
                    return self.answer(400, {"error": "invalid_grant"})
                secret = refresh_tokens.pop(token)
                return self.answer(200, issue(form.get("scope"), secret, False))
            return self.answer(400, {"error": "unsupported_grant_type"})

    def log_message(self, format, *args):
        sys.stderr.write("docs-idp: " + (format % args) + "\n")


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
