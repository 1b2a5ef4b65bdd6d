"""Test support: the real brokerd in a private temporary home, a test OAuth2 IdP, stand-in servers."""

import base64
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

import tokenbroker

REPOSITORY = Path(__file__).resolve().parents[3]


def binary(name: str) -> str:
    """A tokenbroker executable: ``$TOKENBROKER_BIN_DIR/NAME``, else the repository's debug build."""
    directory = os.environ.get("TOKENBROKER_BIN_DIR") or str(REPOSITORY / ".build" / "debug")
    return os.path.join(directory, name)


class BrokerProcess:
    """The real ``brokerd``, started in a private temporary home with its own socket, config,
    vault and key; stopped by PID and always waited for."""

    def __init__(self, config: str = "", environment: Optional[dict] = None, arguments: Sequence[str] = ()):
        self.root = tempfile.mkdtemp(prefix="tbpy-", dir="/tmp")
        for directory in ("home", "run", "config/tokenbroker", "state"):
            os.makedirs(os.path.join(self.root, directory), mode=0o700, exist_ok=True)
        if config:
            with open(os.path.join(self.root, "config/tokenbroker/broker.toml"), "w") as file:
                file.write(config)
        self.socket = os.path.join(self.root, "run/tokenbroker/broker.sock")
        self.log_path = os.path.join(self.root, "brokerd.log")
        self.environment = self.base_environment()
        self.environment.update(environment or {})
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [binary("brokerd"), "--log-level", "debug", *arguments],
                env=self.environment,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        self._wait_for_socket()

    def base_environment(self) -> dict:
        environment = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("TOKENBROKER_", "XDG_", "LISTEN_", "WATCHDOG_"))
            and key not in ("NOTIFY_SOCKET", "CREDENTIALS_DIRECTORY", "STATE_DIRECTORY", "CONFIGURATION_DIRECTORY")
        }
        environment.update(
            HOME=os.path.join(self.root, "home"),
            XDG_RUNTIME_DIR=os.path.join(self.root, "run"),
            XDG_CONFIG_HOME=os.path.join(self.root, "config"),
            XDG_STATE_HOME=os.path.join(self.root, "state"),
        )
        return environment

    def _wait_for_socket(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"brokerd exited with {self.process.returncode}: {self.log}")
            try:
                with tokenbroker.Client(self.socket, timeout=5) as client:
                    client.status()
                return
            except (tokenbroker.BrokerConnectionError, tokenbroker.BrokerError):
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"brokerd did not open its socket in time: {self.log}")

    @property
    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as file:
            return file.read()

    def client(self, **options) -> tokenbroker.Client:
        return tokenbroker.Client(self.socket, **options)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s; always waited for. Removes the home."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if "TB_KEEP" not in os.environ:
            shutil.rmtree(self.root, ignore_errors=True)


class OAuth2IdP:
    """An OAuth2 token endpoint on 127.0.0.1 that rotates refresh tokens (RFC 6749 section 6)
    and checks the client's secret; ``failing`` makes it answer 503."""

    def __init__(self, lifetime: int = 3600):
        self.lifetime = lifetime
        self.client_id = "py-client"
        self.client_secret = "cs-" + secrets.token_hex(12)
        self.refresh_token = "rt-" + secrets.token_hex(12)
        self.refreshes = 0
        self.failing = False
        self.issued: List[str] = []
        self.presented: List[str] = []
        self._lock = threading.Lock()
        idp = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                status, body = idp.answer(self.form(), self.headers.get("Authorization", ""))
                self.send_answer(status, json.dumps(body).encode(), [("Content-Type", "application/json")])

        self.http = LocalHTTPServer(Handler)
        self.token_endpoint = self.http.base_url + "/token"

    def answer(self, form: dict, authorization: str) -> tuple:
        expected = "Basic " + base64.b64encode(f"{self.client_id}:{self.client_secret}".encode()).decode()
        with self._lock:
            if self.failing:
                return 503, {"error": "temporarily_unavailable"}
            if authorization != expected:
                return 401, {"error": "invalid_client"}
            presented = form.get("refresh_token", [""])[0]
            self.presented.append(presented)
            if form.get("grant_type") != ["refresh_token"] or presented != self.refresh_token:
                return 400, {"error": "invalid_grant"}
            self.refreshes += 1
            self.refresh_token = "rt-" + secrets.token_hex(12)
            access_token = f"at-{self.refreshes}-" + secrets.token_hex(8)
            self.issued.append(access_token)
            return 200, {
                "access_token": access_token,
                "token_type": "Bearer",
                "expires_in": self.lifetime,
                "refresh_token": self.refresh_token,
                "scope": "read write",
            }

    def secrets(self) -> List[str]:
        """Every secret that must never be shown: client secret and each refresh token."""
        return [self.client_secret, self.refresh_token] + [p for p in self.presented if p]

    def add_account(self, client: tokenbroker.Client, account: str) -> None:
        """Adds an ``oauth2`` account holding this IdP's current refresh token."""
        add_oauth2_account(client, account, self, client_secret=self.client_secret)

    def stop(self) -> None:
        self.http.stop()


def add_oauth2_account(client: tokenbroker.Client, account: str, idp, **fields: str) -> None:
    """Adds an ``oauth2`` account at ``idp`` (its ``token_endpoint`` and ``client_id``), with
    the provider ``fields`` given, holding ``idp``'s current refresh token."""
    provider = {"kind": "oauth2", "token_endpoint": idp.token_endpoint, "client_id": idp.client_id, **fields}
    client.request("add", account=account, provider=provider, tokens={"refresh_token": idp.refresh_token})


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that logs nothing (the tests' output stays theirs) and answers whole."""

    def log_message(self, *args: object) -> None:
        pass

    def form(self) -> dict:
        """The request's ``application/x-www-form-urlencoded`` body."""
        length = int(self.headers.get("Content-Length") or 0)
        return urllib.parse.parse_qs(self.rfile.read(length).decode())

    def send_answer(self, status: int, body: bytes, headers: Sequence[Tuple[str, str]] = ()) -> None:
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class LocalHTTPServer:
    """An HTTP server on 127.0.0.1, on a free port, answering with ``handler`` on a thread of its
    own; ``stop`` shuts it down and waits for the thread."""

    def __init__(self, handler: type):
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join()


class StandInBroker:
    """A server of this user on a Unix socket that records each request line and answers it
    with ``answer(request)`` (``None``: no answer at all)."""

    def __init__(self, answer: Callable[[dict], Optional[dict]]):
        self.directory = tempfile.mkdtemp(prefix="tbpy-standin-", dir="/tmp")
        self.socket = os.path.join(self.directory, "broker.sock")
        self.requests: List[dict] = []
        self._answer = answer
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.socket)
        self._listener.listen(4)
        self._connections: List[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            connection, _ = self._listener.accept()
        except OSError:
            return
        self._connections.append(connection)
        pending = b""
        try:
            while data := connection.recv(65536):
                pending += data
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    request = json.loads(line)
                    self.requests.append(request)
                    answer = self._answer(request)
                    if answer is not None:
                        connection.sendall(json.dumps(answer).encode() + b"\n")
        except OSError:
            pass

    def stop(self) -> None:
        self._listener.close()
        for connection in self._connections:
            connection.close()
        self._thread.join(timeout=5)
        shutil.rmtree(self.directory, ignore_errors=True)


class Impostor:
    """A server of another user (uid 65534, through setpriv) listening on a Unix socket, as a
    planted socket would; records how many bytes each connection sent it."""

    OTHER_UID = 65534
    SCRIPT = """
import socket, sys
path, ready, record = sys.argv[1:4]
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(path)
server.listen(8)
open(ready, "w").close()
while True:
    connection, _ = server.accept()
    connection.settimeout(10)
    received = 0
    try:
        while data := connection.recv(65536):
            received += len(data)
            connection.sendall(b'{"id":1,"ok":false,"error":{"code":"internal","message":"x"}}\\n')
    except OSError:
        pass
    connection.close()
    with open(record, "a") as file:
        file.write(f"{received}\\n")
"""

    @classmethod
    def possible(cls) -> bool:
        return os.getuid() == 0 and os.access("/usr/bin/setpriv", os.X_OK) and os.access("/usr/bin/python3", os.X_OK)

    def __init__(self):
        self.directory = tempfile.mkdtemp(prefix="tbpy-impostor-", dir="/tmp")
        os.chown(self.directory, self.OTHER_UID, self.OTHER_UID)
        self.socket = os.path.join(self.directory, "broker.sock")
        self.record = os.path.join(self.directory, "received")
        ready = os.path.join(self.directory, "ready")
        self.process = subprocess.Popen(
            [
                "/usr/bin/setpriv",
                f"--reuid={self.OTHER_UID}",
                f"--regid={self.OTHER_UID}",
                "--clear-groups",
                "/usr/bin/python3",
                "-c",
                self.SCRIPT,
                self.socket,
                ready,
                self.record,
            ],
            env={"PATH": "/usr/bin:/bin"},
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 15
        while not os.path.exists(ready):
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.stop()
                raise RuntimeError("the impostor did not start")
            time.sleep(0.02)

    def connections_seen(self) -> List[str]:
        """The bytes received on each connection that has ended, once one has."""
        deadline = time.monotonic() + 10
        text = ""
        while time.monotonic() < deadline:
            if os.path.exists(self.record):
                with open(self.record) as file:
                    text = file.read()
                if text.endswith("\n"):
                    break
            time.sleep(0.02)
        return text.split()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)


def eventually(condition: Callable[[], bool], timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()
