"""DPoP (RFC 9449) from Python: the broker's proofs checked by a test IdP and a test resource
server that verify ES256 signatures with python3-cryptography, against the real brokerd.

No test prints a token or a proof: comparisons that involve one use assertTrue with a message
of their own, so that a failure shows neither.
"""

import email.message
import json
import time
import unittest

import tokenbroker

from .dpop_support import (
    DPoPIdP,
    DPoPRefusal,
    DPoPResourceServer,
    DPoPVerifier,
    TestSigner,
    b64url_decode,
    send,
    sha256_b64url,
    thumbprint,
)
from .support import BrokerProcess, OAuth2IdP


def claims(proof: str, index: int = 1) -> dict:
    """The header (0) or claims (1) of a proof, unverified; for looking at, never for printing."""
    return json.loads(b64url_decode(proof.split(".")[index]))


class UseDPoPNonceCheckTests(unittest.TestCase):
    """``UseDPoPNonce.check`` raises for a nonce demand and for nothing else."""

    CHALLENGE = 'DPoP error="use_dpop_nonce", error_description="Resource server requires nonce in DPoP proof"'

    def demand(self, status: int, headers) -> str:
        with self.assertRaises(tokenbroker.UseDPoPNonce) as raised:
            tokenbroker.UseDPoPNonce.check(status, headers)
        return raised.exception.nonce

    def test_a_401_with_a_dpop_use_dpop_nonce_challenge_and_a_nonce_raises_with_that_nonce(self):
        self.assertEqual(self.demand(401, {"WWW-Authenticate": self.CHALLENGE, "DPoP-Nonce": "eyJ7S_9D"}), "eyJ7S_9D")
        self.assertEqual(self.demand(401, {"WWW-Authenticate": 'DPoP error="use_dpop_nonce"', "DPoP-Nonce": "n"}), "n")
        self.assertEqual(self.demand(401, {"WWW-Authenticate": self.CHALLENGE, "DPoP-Nonce": "x" * 1024}), "x" * 1024)
        punctuation = "!~#$%&'()*+"
        self.assertEqual(self.demand(401, {"WWW-Authenticate": self.CHALLENGE, "DPoP-Nonce": punctuation}), punctuation)
        error = tokenbroker.UseDPoPNonce("nonce-1")
        self.assertIsInstance(error, Exception)
        self.assertNotIsInstance(error, tokenbroker.BrokerError)

    def test_header_names_match_in_any_case_and_any_mapping_with_items_is_read(self):
        for names in (
            ("www-authenticate", "dpop-nonce"),
            ("WWW-AUTHENTICATE", "DPOP-NONCE"),
            ("Www-Authenticate", "Dpop-Nonce"),
        ):
            with self.subTest(names):
                self.assertEqual(self.demand(401, {names[0]: self.CHALLENGE, names[1]: "n-1"}), "n-1")
        message = email.message.Message()  # what urllib's HTTPError.headers and http.client answers are
        message["www-authenticate"] = self.CHALLENGE
        message["DPoP-nonce"] = "n-2"
        self.assertEqual(self.demand(401, message), "n-2")
        self.assertEqual(self.demand(401, {"WWW-Authenticate": 'dpop error="use_dpop_nonce"', "DPoP-Nonce": "n"}), "n")

    def test_anything_else_does_not_raise(self):
        good = {"WWW-Authenticate": self.CHALLENGE, "DPoP-Nonce": "n-1"}
        cases = {
            "200": (200, good),
            "400 (the IdP's answer, not a resource server's)": (400, good),
            "403": (403, good),
            "no challenge": (401, {"DPoP-Nonce": "n-1"}),
            "a Bearer challenge": (401, {"WWW-Authenticate": 'Bearer error="use_dpop_nonce"', "DPoP-Nonce": "n-1"}),
            "another error": (401, {"WWW-Authenticate": 'DPoP error="invalid_token"', "DPoP-Nonce": "n-1"}),
            "an invalid_dpop_proof": (401, {"WWW-Authenticate": 'DPoP error="invalid_dpop_proof"', "DPoP-Nonce": "n"}),
            "no error at all": (401, {"WWW-Authenticate": 'DPoP algs="ES256"', "DPoP-Nonce": "n-1"}),
            "no nonce": (401, {"WWW-Authenticate": self.CHALLENGE}),
            "an empty nonce": (401, {"WWW-Authenticate": self.CHALLENGE, "DPoP-Nonce": ""}),
            "a nonce with a space": (401, {"WWW-Authenticate": self.CHALLENGE, "DPoP-Nonce": "a b"}),
            "a nonce with a quote": (401, {"WWW-Authenticate": self.CHALLENGE, "DPoP-Nonce": 'a"b'}),
            "a nonce with a backslash": (401, {"WWW-Authenticate": self.CHALLENGE, "DPoP-Nonce": "a\\b"}),
            "a nonce with a control character": (401, {"WWW-Authenticate": self.CHALLENGE, "DPoP-Nonce": "a\tb"}),
            "a nonce beyond ASCII": (401, {"WWW-Authenticate": self.CHALLENGE, "DPoP-Nonce": "n\u00e9"}),
            "a nonce of 1,025 characters": (401, {"WWW-Authenticate": self.CHALLENGE, "DPoP-Nonce": "x" * 1025}),
            "no headers": (401, {}),
        }
        for label, (status, headers) in cases.items():
            with self.subTest(label):
                self.assertIsNone(tokenbroker.UseDPoPNonce.check(status, headers))


class VerifierTests(unittest.TestCase):
    """The test verifier refuses what it must, shown with a key of the test's own: a broker
    proof it accepts therefore means something."""

    URL = "https://rs.example/items"

    def setUp(self):
        self.signer = TestSigner()
        self.verifier = DPoPVerifier()

    def refusal(self, proofs, method="GET", url=URL, **options) -> str:
        with self.assertRaises(DPoPRefusal) as raised:
            self.verifier.verify(proofs, method, url, **options)
        return raised.exception.reason

    def test_a_good_proof_is_accepted_once(self):
        proof = self.signer.proof("GET", self.URL, ath=sha256_b64url("at-1"), nonce="n-1")
        jkt, payload = self.verifier.verify(
            [proof], "GET", self.URL + "?page=2", access_token="at-1", nonce="n-1", bound_to=self.signer.thumbprint
        )
        self.assertEqual(jkt, self.signer.thumbprint)
        self.assertEqual(payload["htm"], "GET")
        self.assertEqual(self.refusal([proof], access_token="at-1", nonce="n-1"), "replayed")

    def test_each_check_can_fail(self):
        other = TestSigner()
        good = self.signer.proof("GET", self.URL)
        jwk_with_d = dict(self.signer.jwk, d="AAAA")
        header, payload, signature = good.split(".")
        cases = {
            "missing": ([], {}),
            "multiple": ([good, self.signer.proof("GET", self.URL)], {}),
            "malformed": (["a.b"], {}),
            "typ": ([self.signer.proof("GET", self.URL, header={"typ": "JWT"})], {}),
            "alg": ([self.signer.proof("GET", self.URL, header={"alg": "HS256"})], {}),
            "jwk_private": ([self.signer.proof("GET", self.URL, header={"jwk": jwk_with_d})], {}),
            "jwk": ([self.signer.proof("GET", self.URL, header={"jwk": dict(self.signer.jwk, crv="P-384")})], {}),
            "signature": ([f"{header}.{other.proof('GET', self.URL).split('.')[1]}.{signature}"], {}),
            "jti": ([self.signer.proof("GET", self.URL, jti="short")], {}),
            "htm": ([self.signer.proof("POST", self.URL)], {}),
            "htu": ([self.signer.proof("GET", "https://rs.example/other")], {}),
            "iat": ([self.signer.proof("GET", self.URL, iat=int(time.time()) - 120)], {}),
            "ath": ([self.signer.proof("GET", self.URL, ath=sha256_b64url("at-other"))], {"access_token": "at-1"}),
            "nonce": ([self.signer.proof("GET", self.URL)], {"nonce": "n-1"}),
            "jkt": ([other.proof("GET", self.URL)], {"bound_to": self.signer.thumbprint}),
        }
        for reason, (proofs, options) in cases.items():
            with self.subTest(reason):
                self.assertEqual(self.refusal(proofs, **options), reason)
        # An htu with a query is refused even for a request with that query.
        with_query = self.signer.proof("GET", self.URL + "?page=2")
        self.assertEqual(self.refusal([with_query], url=self.URL + "?page=2"), "htu")
        # None of the refused proofs' jtis was remembered: the good one is still accepted.
        self.assertEqual(self.verifier.verify([good], "GET", self.URL)[0], self.signer.thumbprint)

    def test_the_thumbprint_is_rfc_7638s(self):
        # RFC 7638 section 3.2: the required members (crv, kty, x, y for EC) in lexical order.
        x, y = self.signer.jwk["x"], self.signer.jwk["y"]
        expected = sha256_b64url('{"crv":"P-256","kty":"EC","x":"%s","y":"%s"}' % (x, y))
        self.assertEqual(thumbprint(self.signer.jwk["x"], self.signer.jwk["y"]), expected)
        self.assertEqual(len(expected), 43)


class BrokerDPoPTests(unittest.TestCase):
    """``dpop_headers`` and ``with_dpop`` against the real brokerd, its proofs verified."""

    def setUp(self):
        self.broker = BrokerProcess()
        self.addCleanup(self.broker.stop)
        self.client = self.broker.client(timeout=30)
        self.addCleanup(self.client.close)

    def start_idp(self, **options) -> DPoPIdP:
        idp = DPoPIdP(**options)
        self.addCleanup(idp.stop)
        return idp

    def start_resource(self, idp: DPoPIdP, **options) -> DPoPResourceServer:
        resource = DPoPResourceServer(idp, **options)
        self.addCleanup(resource.stop)
        return resource

    def dpop_account(self, name: str = "api", **options):
        """An account of a new DPoP IdP, its first refresh (started by ``add``) done; and a
        resource server taking that IdP's tokens."""
        idp = self.start_idp(**options)
        idp.add_account(self.client, name)
        self.client.token(name)
        return idp, self.start_resource(idp)

    def get(self, resource: DPoPResourceServer, headers, url=None, method="GET"):
        pairs = headers.items() if isinstance(headers, dict) else headers
        return send(method, url or resource.url, list(pairs))

    def test_dpop_headers_are_accepted_and_status_names_the_key_the_token_is_bound_to(self):
        idp, resource = self.dpop_account()
        headers = self.client.dpop_headers("api", "GET", resource.url)
        self.assertEqual(sorted(headers), ["Authorization", "DPoP"])
        scheme, token = headers["Authorization"].split(" ", 1)
        self.assertEqual(scheme, "DPoP")
        self.assertTrue(token == idp.issued[-1], "the Authorization header holds the IdP's latest token")

        status, _ = self.get(resource, headers)
        self.assertEqual((status, resource.refusals), (200, []))

        [account] = self.client.status("api")
        self.assertEqual(set(account["dpop"]), {"algorithm", "thumbprint"})
        self.assertEqual(account["dpop"]["algorithm"], "ES256")
        bound = idp.bound_thumbprint(token)
        self.assertIsNotNone(bound)
        self.assertEqual(account["dpop"]["thumbprint"], bound)
        self.assertNotIn("issued_token_type", account)

        # The proof: the public key only, the claims RFC 9449 section 4.2 names.
        header, payload = claims(headers["DPoP"], 0), claims(headers["DPoP"])
        self.assertEqual((header["typ"], header["alg"]), ("dpop+jwt", "ES256"))
        self.assertEqual(sorted(header["jwk"]), ["crv", "kty", "x", "y"])
        self.assertEqual(thumbprint(header["jwk"]["x"], header["jwk"]["y"]), bound)
        self.assertEqual(sorted(payload), ["ath", "htm", "htu", "iat", "jti"])
        self.assertEqual((payload["htm"], payload["htu"]), ("GET", resource.url))
        self.assertTrue(payload["ath"] == sha256_b64url(token), "ath is the token's hash")

        # The IdP checked the broker's proof at the token endpoint too, and bound the refresh token.
        self.assertEqual((idp.refreshes, idp.refusals, idp.proof_nonces), (1, [], [None]))
        self.assertEqual(self.client.token("api").token_type, "DPoP")

        # Each call makes a new proof for the same token, accepted as well; no refresh for it.
        again = self.client.dpop_headers("api", "GET", resource.url)
        self.assertTrue(again["Authorization"] == headers["Authorization"], "the same token")
        self.assertNotEqual(claims(again["DPoP"])["jti"], payload["jti"])
        self.assertEqual(self.get(resource, again)[0], 200)
        self.assertEqual((resource.successes, idp.refreshes), (2, 1))

    def test_the_query_and_fragment_are_left_out_of_htu(self):
        _, resource = self.dpop_account()
        headers = self.client.dpop_headers("api", "GET", resource.url + "?page=2#top")
        self.assertEqual(claims(headers["DPoP"])["htu"], resource.url)
        self.assertEqual(self.get(resource, headers, url=resource.url + "?page=2")[0], 200)

    def test_a_refresh_binds_the_new_token_to_the_same_key(self):
        idp, resource = self.dpop_account()
        thumbprint_before = self.client.status("api")[0]["dpop"]["thumbprint"]
        self.client.request("refresh", account="api")
        self.assertEqual(idp.refreshes, 2)
        headers = self.client.dpop_headers("api", "POST", resource.url)
        self.assertTrue(headers["Authorization"] == "DPoP " + idp.issued[1], "the refreshed token")
        self.assertEqual(self.get(resource, headers, method="POST")[0], 200)
        self.assertEqual({idp.bound_thumbprint(token) for token in idp.issued}, {thumbprint_before})
        self.assertEqual(self.client.status("api")[0]["dpop"]["thumbprint"], thumbprint_before)
        self.assertEqual(idp.refusals, [])

    def test_the_idp_refuses_proofs_that_fail_and_a_refresh_token_bound_to_another_key(self):
        idp, _ = self.dpop_account()
        bound_refresh_token = idp.refresh_token  # bound to the broker's key by the first refresh
        foreign = TestSigner()
        form = {"grant_type": "refresh_token", "refresh_token": bound_refresh_token, "client_id": idp.client_id}
        url = idp.token_endpoint
        cases = [
            ("no proof", [], "missing"),
            ("a proof for GET", [("DPoP", foreign.proof("GET", url))], "htm"),
            ("a proof for another URL", [("DPoP", foreign.proof("POST", url + "/other"))], "htu"),
            ("a stale proof", [("DPoP", foreign.proof("POST", url, iat=int(time.time()) - 300))], "iat"),
            ("a good proof of another key", [("DPoP", foreign.proof("POST", url))], "jkt"),
        ]
        for label, headers, reason in cases:
            with self.subTest(label):
                before = len(idp.refusals)
                self.assertEqual(send("POST", url, headers, form)[0], 400)
                self.assertEqual(idp.refusals[before:], [reason])
        self.assertEqual(idp.refreshes, 1)
        # The broker, with its own key, still refreshes with that refresh token.
        self.client.request("refresh", account="api")
        self.assertEqual(idp.refreshes, 2)
        self.assertTrue(idp.presented[-1] == bound_refresh_token, "the broker presented the bound refresh token")

    def test_the_broker_answers_the_idps_nonce_demand_and_keeps_the_nonce(self):
        idp, resource = self.dpop_account(require_nonce=True)
        # Adding the account refreshed: refused once for want of the nonce, then done with it.
        self.assertEqual((idp.refusals, idp.proof_nonces, idp.refreshes), (["nonce"], [idp.nonce], 1))
        self.assertEqual(self.get(resource, self.client.dpop_headers("api", "GET", resource.url))[0], 200)

        self.client.request("refresh", account="api")
        self.assertEqual(idp.refusals, ["nonce"], "the kept nonce is sent at once")
        self.assertEqual(idp.proof_nonces[-1], idp.nonce)

        idp.rotate_nonce()
        self.client.request("refresh", account="api")
        self.assertEqual((idp.refusals, idp.refreshes), (["nonce", "nonce"], 3))
        self.assertEqual(idp.proof_nonces[-1], idp.nonce)
        self.assertEqual(self.get(resource, self.client.dpop_headers("api", "GET", resource.url))[0], 200)

    def test_with_dpop_answers_a_resource_servers_nonce_demand_once(self):
        idp, _ = self.dpop_account()
        resource = self.start_resource(idp, require_nonce=True)
        statuses = []

        def get(headers):
            status, answer = self.get(resource, headers)
            statuses.append(status)
            tokenbroker.UseDPoPNonce.check(status, answer)
            return status

        self.assertEqual(self.client.with_dpop("api", "GET", resource.url, get), 200)
        self.assertEqual(statuses, [401, 200])
        self.assertEqual(resource.refusals, ["nonce"])
        self.assertEqual(resource.proof_nonces, [None, resource.nonce])
        self.assertEqual(resource.successes, 1)

        # With the nonce known, dpop_headers(nonce=...) succeeds at once.
        headers = self.client.dpop_headers("api", "GET", resource.url, nonce=resource.nonce)
        self.assertEqual(self.get(resource, headers)[0], 200)

    def test_with_dpop_runs_a_willing_body_once_and_lets_a_second_demand_through(self):
        idp, plain = self.dpop_account()
        calls = []
        self.assertEqual(self.client.with_dpop("api", "GET", plain.url, lambda h: calls.append(h) or 7), 7)
        self.assertEqual(len(calls), 1)

        resource = self.start_resource(idp, require_nonce=True)
        statuses = []

        def get_while_the_nonce_changes(headers):
            if statuses:
                resource.rotate_nonce()  # the nonce the broker was given is stale by now
            status, answer = self.get(resource, headers)
            statuses.append(status)
            tokenbroker.UseDPoPNonce.check(status, answer)
            return status

        with self.assertRaises(tokenbroker.UseDPoPNonce):
            self.client.with_dpop("api", "GET", resource.url, get_while_the_nonce_changes)
        self.assertEqual(statuses, [401, 401])
        self.assertEqual(resource.refusals, ["nonce", "nonce"])

        def broken(headers):
            raise KeyError("not a nonce demand")

        with self.assertRaises(KeyError):
            self.client.with_dpop("api", "GET", resource.url, broken)

    def test_the_resource_server_refuses_what_it_must(self):
        idp, resource = self.dpop_account()
        fresh = lambda method="GET", url=resource.url: self.client.dpop_headers("api", method, url)  # noqa: E731
        token = idp.issued[-1]
        replayed = fresh()
        self.assertEqual(self.get(resource, replayed)[0], 200)
        foreign = TestSigner()  # a key of the test's own: right claims, wrong key
        foreign_proof = foreign.proof("GET", resource.url, ath=sha256_b64url(token))
        cases = [
            ("the same headers again", replayed, "invalid_dpop_proof", "replayed"),
            ("headers for another URL", fresh(url=resource.base_url + "/other"), "invalid_dpop_proof", "htu"),
            ("headers for another port", fresh(url="http://127.0.0.1:1/items"), "invalid_dpop_proof", "htu"),
            ("headers for another method", fresh("POST"), "invalid_dpop_proof", "htm"),
            ("the token without a proof", [("Authorization", f"DPoP {token}")], "invalid_dpop_proof", "missing"),
            ("two proofs", [*fresh().items(), ("DPoP", fresh()["DPoP"])], "invalid_dpop_proof", "multiple"),
            ("a proof of another key", [("Authorization", f"DPoP {token}"), ("DPoP", foreign_proof)],
             "invalid_dpop_proof", "jkt"),
            ("the token as Bearer", [("Authorization", f"Bearer {token}"), ("DPoP", fresh()["DPoP"])],
             "invalid_token", "bearer"),
            ("the token as Bearer without a proof", [("Authorization", f"Bearer {token}")], "invalid_token", "bearer"),
            ("a token the IdP never issued", [("Authorization", "DPoP at-forged"), ("DPoP", fresh()["DPoP"])],
             "invalid_token", "token"),
        ]
        for label, headers, error, reason in cases:
            with self.subTest(label):
                before = len(resource.refusals)
                status, answer = self.get(resource, headers)
                self.assertEqual(status, 401)
                self.assertIn(f'error="{error}"', answer.get("WWW-Authenticate", ""))
                self.assertEqual(resource.refusals[before:], [reason])
                self.assertIsNone(tokenbroker.UseDPoPNonce.check(status, answer))
        status, answer = self.get(resource, [])
        self.assertEqual((status, answer.get("WWW-Authenticate")), (401, 'DPoP algs="ES256"'))
        self.assertEqual(resource.refusals[-1], "no_token")
        # Refused requests used up nothing: a fresh pair still works.
        self.assertEqual(self.get(resource, fresh())[0], 200)
        self.assertEqual(resource.successes, 2)

    def test_bearer_accounts_bad_urls_and_bad_methods_are_bad_requests(self):
        idp, resource = self.dpop_account()
        bearer_idp = OAuth2IdP()
        self.addCleanup(bearer_idp.stop)
        bearer_idp.add_account(self.client, "plain")
        self.client.request("add", account="fixed", provider={"kind": "static"},
                            tokens={"access_token": "at-static-dpop", "expires_in": 3600})
        for account in ("plain", "fixed"):
            with self.subTest(account):
                with self.assertRaises(tokenbroker.BadRequest) as raised:
                    self.client.dpop_headers(account, "GET", resource.url)
                self.assertIn("bearer", raised.exception.message.lower())
        self.assertNotIn("dpop", self.client.status("plain")[0])

        bad = [
            ("GET", "ftp://x"),
            ("GET", "/items"),
            ("GET", "items"),
            ("GET", "http://example.com/items"),
            ("GET", "http://10.0.0.1/items"),
            ("GET", "https:///items"),
            ("GET", ""),
            ("GET", "https://rs.example/" + "a" * 2100),
            ("", resource.url),
            ("G ET", resource.url),
            ("GET\n", resource.url),
            ("A" * 33, resource.url),
        ]
        for method, url in bad:
            with self.subTest(method=method[:10], url=url[:40]):
                with self.assertRaises(tokenbroker.BadRequest):
                    self.client.dpop_headers("api", method, url)
        for nonce in ("", 'a"b', "a b", "x" * 1025):
            with self.subTest(nonce=nonce[:10]):
                with self.assertRaises(tokenbroker.BadRequest):
                    self.client.dpop_headers("api", "GET", resource.url, nonce=nonce)
        with self.assertRaises(TypeError):
            self.client.dpop_headers("api", "GET", b"https://rs.example/")

        # What is allowed: https anywhere, http to a loopback host, any method token.
        for method, url in (("GET", "https://api.example/v1/items"), ("PATCH", "http://localhost:1/x"),
                            ("PROPFIND", "http://[::1]/x"), ("GET", "http://127.0.0.2/x")):
            with self.subTest(allowed=url):
                proof = self.client.dpop_headers("api", method, url)["DPoP"]
                self.assertEqual((claims(proof)["htm"], claims(proof)["htu"]), (method, url))
        self.assertEqual((idp.refreshes, idp.refusals), (1, []))

    def test_no_proof_or_refresh_token_in_the_log_or_in_errors(self):
        idp, resource = self.dpop_account(require_nonce=True)
        proofs = [self.client.dpop_headers("api", "GET", resource.url)["DPoP"] for _ in range(2)]
        token = idp.issued[-1]
        outputs = [repr(self.client.status()), repr(self.client.token("api"))]
        for call in (lambda: self.client.dpop_headers("api", "GET", "ftp://x"),
                     lambda: self.client.dpop_headers("api", "GET", resource.url, nonce='"')):
            try:
                call()
            except tokenbroker.BrokerError as error:
                outputs += [str(error), repr(error)]
        self.client.request("refresh", account="api")
        log = self.broker.log
        for secret in [*proofs, token, *idp.secrets()]:
            for output in outputs:
                self.assertFalse(secret in output, "a secret in an output")
        for secret in [*proofs, *idp.secrets()]:
            # Not assertNotIn, whose failure message would print the secret and the log.
            self.assertFalse(secret in log, "a proof or refresh token in the broker's log")
            self.assertFalse(secret.split(".")[-1] in log, "a proof's signature in the broker's log")


if __name__ == "__main__":
    unittest.main()
