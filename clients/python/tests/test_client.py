"""The Python client against the real brokerd (and stand-ins where the broker cannot be made to misbehave)."""

import os
import re
import subprocess
import time
import unittest
from datetime import datetime, timedelta, timezone

import tokenbroker
from tokenbroker.errors import ERRORS_BY_CODE, error_from_wire

from .support import REPOSITORY, BrokerProcess, Impostor, OAuth2IdP, StandInBroker, binary, eventually


def add_static(client: tokenbroker.Client, account: str, access_token: str, expires_in: int = 3600, **extra) -> None:
    tokens = {"access_token": access_token, "expires_in": expires_in, **extra}
    client.request("add", account=account, provider={"kind": "static"}, tokens=tokens)


class DefaultSocketTests(unittest.TestCase):
    """The default path is the one brokerctl (BrokerProtocol's DefaultPaths) computes."""

    def brokerctl_path(self, environment: dict) -> str:
        """The socket brokerctl tries, read from its 'not running at PATH' message."""
        result = subprocess.run(
            [binary("brokerctl"), "status"], env=environment, capture_output=True, text=True, timeout=60
        )
        match = re.search(r"not running at (\S+) ", result.stderr)
        self.assertIsNotNone(match, result.stderr)
        return match.group(1)

    def test_each_variable_is_read_as_brokerctl_reads_it(self):
        base = {"PATH": "/usr/bin:/bin", "HOME": "/tmp/tbpy-nohome"}
        cases = [
            {"TOKENBROKER_SOCKET": "/tmp/tbpy-none/explicit.sock", "XDG_RUNTIME_DIR": "/tmp/tbpy-none/run"},
            {"TOKENBROKER_SOCKET": "", "XDG_RUNTIME_DIR": "/tmp/tbpy-none/run"},
            {"XDG_STATE_HOME": "/tmp/tbpy-none/state"},
            {"XDG_RUNTIME_DIR": "", "XDG_STATE_HOME": ""},
        ]
        for extra in cases:
            environment = {**base, **extra}
            with self.subTest(extra):
                self.assertEqual(tokenbroker.default_socket(environment), self.brokerctl_path(environment))

    def test_without_a_runtime_dir_the_login_runtime_dir_or_the_state_dir_is_used(self):
        login_runtime = f"/run/user/{os.getuid()}"
        expected = (login_runtime if os.path.exists(login_runtime) else "/h/.local/state") + "/tokenbroker/broker.sock"
        self.assertEqual(tokenbroker.default_socket({"HOME": "/h"}), expected)

    def test_the_client_takes_tokenbroker_socket_from_the_environment(self):
        saved = os.environ.get("TOKENBROKER_SOCKET")
        os.environ["TOKENBROKER_SOCKET"] = "/tmp/tbpy-none/env.sock"
        try:
            self.assertEqual(tokenbroker.Client().socket, "/tmp/tbpy-none/env.sock")
        finally:
            if saved is None:
                del os.environ["TOKENBROKER_SOCKET"]
            else:
                os.environ["TOKENBROKER_SOCKET"] = saved


class ErrorClassTests(unittest.TestCase):
    def test_every_code_of_the_swift_error_code_list_has_its_own_subclass(self):
        source = (REPOSITORY / "Sources/BrokerProtocol/BrokerError.swift").read_text()
        codes = re.findall(r'public static let \S+ = Code\("([a-z_]+)"\)', source)
        self.assertEqual(len(codes), 13)
        self.assertEqual(sorted(codes), sorted(ERRORS_BY_CODE))
        for code in codes:
            error = error_from_wire({"code": code, "message": "m", "retry_after_ms": 5})
            self.assertIs(type(error), ERRORS_BY_CODE[code])
            self.assertTrue(issubclass(type(error), tokenbroker.BrokerError))
            self.assertEqual((error.code, error.message, error.retry_after_ms), (code, "m", 5))
        self.assertEqual(len(set(ERRORS_BY_CODE.values())), 13)

    def test_an_unknown_code_becomes_internal(self):
        error = error_from_wire({"code": "from_the_future", "message": "m"})
        self.assertIsInstance(error, tokenbroker.Internal)
        self.assertEqual(error.code, "internal")


class LiveBrokerTests(unittest.TestCase):
    """Every method against the real brokerd."""

    def setUp(self):
        self.broker = BrokerProcess()
        self.addCleanup(self.broker.stop)
        self.client = self.broker.client(timeout=30)
        self.addCleanup(self.client.close)

    def start_idp(self, lifetime: int = 3600) -> OAuth2IdP:
        idp = OAuth2IdP(lifetime)
        self.addCleanup(idp.stop)
        return idp

    def test_token_of_a_static_account(self):
        add_static(self.client, "demo", "at-static-1", expires_in=3600, scope="read")
        before = datetime.now(timezone.utc)
        token = self.client.token("demo")
        self.assertEqual(token.account, "demo")
        self.assertEqual(token.access_token, "at-static-1")
        self.assertEqual(token.token_type, "Bearer")
        self.assertEqual(token.scope, "read")
        self.assertEqual(token.expires_at.tzinfo, timezone.utc)
        self.assertLessEqual(abs(token.expires_at - (before + timedelta(seconds=3600))), timedelta(seconds=5))
        self.assertTrue(3590 <= token.expires_in <= 3600, token.expires_in)

    def test_token_errors_raise_the_subclass_of_their_code(self):
        add_static(self.client, "short", "at-short", expires_in=60)
        cases = [
            (lambda: self.client.token("absent"), tokenbroker.NotFound),
            (lambda: self.client.token(""), tokenbroker.BadRequest),
            (lambda: self.client.token("short", min_ttl=600), tokenbroker.NeedsLogin),
            (lambda: self.client.request("no_such_op"), tokenbroker.UnknownOp),
            (lambda: self.client.request("hello", versions=[2]), tokenbroker.UnsupportedVersion),
        ]
        for call, expected in cases:
            with self.subTest(expected.__name__):
                with self.assertRaises(expected) as raised:
                    call()
                self.assertEqual(raised.exception.code, expected.code)
                self.assertTrue(raised.exception.message)
        # The connection is still good after each failure.
        self.assertEqual(self.client.token("short", min_ttl=10).access_token, "at-short")

    def test_an_idp_that_fails_answers_unavailable_with_a_retry_delay(self):
        idp = self.start_idp()
        idp.failing = True
        idp.add_account(self.client, "flaky")
        with self.assertRaises(tokenbroker.Unavailable) as raised:
            self.client.token("flaky")
        self.assertIsInstance(raised.exception.retry_after_ms, int)

    def test_a_locked_broker_answers_locked(self):
        broker = BrokerProcess(arguments=["--passphrase"])
        self.addCleanup(broker.stop)
        with broker.client(timeout=10) as client:
            with self.assertRaises(tokenbroker.Locked) as raised:
                client.token("demo")
            self.assertIn("brokerctl unlock", raised.exception.message)

    def test_numbers_and_lines_the_broker_would_refuse_are_refused_before_sending(self):
        for bad in (float("nan"), float("inf"), -1):
            with self.subTest(bad):
                with self.assertRaises(ValueError):
                    self.client.token("demo", min_ttl=bad)
        with self.assertRaises(TypeError):
            self.client.token("demo", min_ttl=True)
        with self.assertRaises(tokenbroker.LineTooLong):
            self.client.token("x" * 70000)
        self.assertEqual(self.client.status(), [])

    def test_reject_of_the_current_token_refreshes_once(self):
        idp = self.start_idp()
        idp.add_account(self.client, "api")
        first = self.client.token("api")
        self.assertEqual(first.access_token, idp.issued[0])
        self.assertEqual(first.scope, "read write")

        second = self.client.reject("api", first.access_token)
        self.assertEqual(second.access_token, idp.issued[1])
        self.assertEqual(idp.refreshes, 2)
        # The old token again: no new refresh, the current token comes back.
        self.assertEqual(self.client.reject("api", first.access_token).access_token, second.access_token)
        self.assertEqual(idp.refreshes, 2)

    def test_with_token_retries_once_with_a_fresh_token(self):
        idp = self.start_idp()
        idp.add_account(self.client, "api")
        seen = []

        def refuse_first(access_token: str) -> str:
            seen.append(access_token)
            if len(seen) == 1:
                raise tokenbroker.TokenRefused()
            return "body result"

        self.assertEqual(self.client.with_token("api", refuse_first), "body result")
        self.assertEqual(seen, idp.issued[:2])
        self.assertEqual(idp.refreshes, 2)

    def test_with_token_lets_a_second_refusal_through_and_calls_a_willing_body_once(self):
        idp = self.start_idp()
        idp.add_account(self.client, "api")
        calls = []

        def always_refuse(access_token: str) -> None:
            calls.append(access_token)
            raise tokenbroker.TokenRefused()

        with self.assertRaises(tokenbroker.TokenRefused):
            self.client.with_token("api", always_refuse)
        self.assertEqual(calls, idp.issued[:2])

        calls.clear()
        self.assertEqual(self.client.with_token("api", lambda token: calls.append(token) or len(calls)), 1)
        self.assertEqual(calls, [idp.issued[1]])
        self.assertEqual(idp.refreshes, 2)

    def test_with_token_does_not_swallow_other_errors(self):
        add_static(self.client, "demo", "at-static-2")

        def broken(access_token: str) -> None:
            raise KeyError("not a refusal")

        with self.assertRaises(KeyError):
            self.client.with_token("demo", broken)

    def test_status(self):
        add_static(self.client, "b-static", "at-b")
        add_static(self.client, "a-static", "at-a")
        accounts = self.client.status()
        self.assertEqual([(a["account"], a["provider"], a["state"]) for a in accounts],
                         [("a-static", "static", "valid"), ("b-static", "static", "valid")])
        self.assertEqual([a["account"] for a in self.client.status("b-static")], ["b-static"])
        with self.assertRaises(tokenbroker.NotFound):
            self.client.status("nobody")

    def test_events(self):
        idp = self.start_idp()
        with self.client.events() as events:
            idp.add_account(self.client, "api")
            received = [next(events), next(events)]
            self.client.request("remove", account="api")
            received.append(next(events))
        self.assertEqual(
            [(e.event, e.account) for e in received], [("added", "api"), ("refreshed", "api"), ("removed", "api")]
        )
        self.assertEqual(received[1].state, "valid")
        self.assertEqual(received[1].expires_at.tzinfo, timezone.utc)
        self.assertLessEqual(abs(received[0].at - datetime.now(timezone.utc)), timedelta(seconds=30))
        self.assertNotIn(idp.issued[0], repr(received))

    def test_events_of_named_accounts_only(self):
        add_static(self.client, "quiet", "at-q")
        with self.client.events(["loud"]) as events:
            self.client.request("remove", account="quiet")
            add_static(self.client, "loud", "at-l")
            self.assertEqual((lambda e: (e.event, e.account))(next(events)), ("added", "loud"))

    def test_a_connection_the_broker_closed_for_idleness_is_replaced(self):
        broker = BrokerProcess(config="[broker]\nidle_connection_timeout = 0.3\n")
        self.addCleanup(broker.stop)
        with broker.client(timeout=10) as client:
            add_static(client, "demo", "at-idle")
            time.sleep(1.0)
            self.assertEqual(client.token("demo").access_token, "at-idle")

    def test_forbidden_for_an_account_whose_rule_does_not_list_this_program(self):
        broker = BrokerProcess(config='[accounts.guarded.access]\nexecutables = ["/bin/true"]\n')
        self.addCleanup(broker.stop)
        with broker.client(timeout=10) as client:
            add_static(client, "guarded", "at-guarded")
            with self.assertRaises(tokenbroker.Forbidden):
                client.token("guarded")

    def test_no_secret_but_the_access_token_in_any_output(self):
        idp = self.start_idp()
        idp.add_account(self.client, "api")
        token = self.client.token("api")
        idp.failing = True
        outputs = [repr(token), str(token), repr(self.client.status()), repr(self.client)]
        try:
            self.client.reject("api", token.access_token)
        except tokenbroker.BrokerError as error:
            outputs += [str(error), repr(error), error.message]
        else:
            self.fail("a reject while the IdP fails should fail")
        for output in outputs:
            self.assertNotIn(token.access_token, output)
        for secret in idp.secrets():
            for output in outputs + [self.broker.log]:
                # Not assertNotIn, whose failure message would print the secret and the output.
                self.assertFalse(secret in output, "a secret in an output")


class StandInTests(unittest.TestCase):
    """What only a stand-in broker can show: the exact lines sent, an answer that never comes."""

    def test_scope_and_resource_are_sent_when_given(self):
        def answer(request: dict) -> dict:
            result = {
                "account": request["account"],
                "access_token": "at-scoped",
                "token_type": "Bearer",
                "expires_at": "2030-01-01T00:00:00Z",
                "expires_in": 100,
                "scope": request.get("scope", "all"),
            }
            return {"id": request["id"], "ok": True, "result": result}

        broker = StandInBroker(answer)
        self.addCleanup(broker.stop)
        with tokenbroker.Client(broker.socket, timeout=5) as client:
            token = client.token("api", min_ttl=60, scope="read", resource="https://rs.example/")
            client.token("api")
            client.reject("api", "at-old", scope="read")
        self.assertEqual(token.scope, "read")
        self.assertEqual(token.expires_at, datetime(2030, 1, 1, tzinfo=timezone.utc))
        first, second, third = broker.requests
        self.assertEqual(
            first,
            {"id": 1, "op": "token", "account": "api", "min_ttl": 60, "scope": "read", "resource": "https://rs.example/"},
        )
        self.assertEqual(second, {"id": 2, "op": "token", "account": "api", "min_ttl": 30})
        self.assertEqual(third["scope"], "read")
        self.assertEqual(third["access_token"], "at-old")
        self.assertNotIn("resource", third)

    def test_a_broker_that_does_not_answer_times_out(self):
        broker = StandInBroker(lambda request: None)
        self.addCleanup(broker.stop)
        client = tokenbroker.Client(broker.socket, timeout=0.3)
        self.addCleanup(client.close)
        started = time.monotonic()
        with self.assertRaises(tokenbroker.BrokerConnectionError) as raised:
            client.token("api")
        self.assertIn("did not answer in time", str(raised.exception))
        self.assertLess(time.monotonic() - started, 10)

    def test_no_broker_at_the_path(self):
        with self.assertRaises(tokenbroker.BrokerConnectionError) as raised:
            tokenbroker.Client("/tmp/tbpy-none/absent.sock").status()
        self.assertIn("not running at /tmp/tbpy-none/absent.sock", str(raised.exception))


@unittest.skipUnless(Impostor.possible(), "needs root, setpriv and /usr/bin/python3 to run a server as another uid")
class ServerUidTests(unittest.TestCase):
    def test_a_socket_served_by_another_uid_is_refused_before_anything_is_sent(self):
        impostor = Impostor()
        self.addCleanup(impostor.stop)
        client = tokenbroker.Client(impostor.socket, timeout=5)
        with self.assertRaises(tokenbroker.BrokerConnectionError) as raised:
            client.reject("stolen", "at-must-not-leak")
        self.assertIn(f"served by uid {Impostor.OTHER_UID}", str(raised.exception))
        self.assertNotIn("must-not-leak", str(raised.exception))
        with self.assertRaises(tokenbroker.BrokerConnectionError):
            client.events()
        self.assertEqual(impostor.connections_seen()[:1], ["0"])
        self.assertTrue(eventually(lambda: impostor.connections_seen() == ["0", "0"]))


if __name__ == "__main__":
    unittest.main()
