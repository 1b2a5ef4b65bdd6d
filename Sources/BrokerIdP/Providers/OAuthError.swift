import BrokerModel
import BrokerProtocol
import BrokerSecrets
import FoundationEssentials

/// An IdP's OAuth error answer (RFC 6749 section 5.2): its `error` code and `error_description`,
/// and whether the code stops the account.
///
/// Only an explicit refusal stops an account: `invalid_grant` (the refresh credential is
/// revoked, expired or unknown; signing in again is the cure) and the client errors
/// `invalid_client` and `unauthorized_client` (the client's settings are at fault). Every other
/// code is transient, so an IdP's hiccup never costs a sign-in: `server_error` and
/// `temporarily_unavailable` say so themselves, and an unknown code says nothing of the
/// credential. `invalid_request`, `unsupported_grant_type` and `invalid_scope` fault the request
/// or the account's settings, not the credential, and neither a sign-in nor new tokens would
/// change them; the account keeps its credential and retries at its backoff (a corrected config
/// is used at the next attempt) while `status` shows the IdP's words.
package struct OAuthError: Sendable, Equatable {
    package var code: String
    package var description: String?

    /// The codes that fault the client (its id, secret or authentication), not the grant.
    package static let clientErrors: Set<String> = ["invalid_client", "unauthorized_client"]
    /// The codes that stop the account (see the type's comment).
    package static let denials = clientErrors.union(["invalid_grant"])
    /// The codes by which an IdP says the failure is its own and passing.
    package static let serverErrors: Set<String> = ["server_error", "temporarily_unavailable"]

    /// The error of an answer's JSON object: a non-empty string `error`, and an
    /// `error_description` when it is a non-empty string.
    package init?(_ object: [String: JSONValue]) {
        guard let code = object["error"]?.text, !code.isEmpty else { return nil }
        self.code = code
        description = object["error_description"]?.text.flatMap { $0.isEmpty ? nil : $0 }
    }

    /// The error of `reply`, when its body is an OAuth error object.
    package init?(_ reply: IdPReply) {
        guard let object = JSONValue.object(decoding: reply.body) else { return nil }
        self.init(object)
    }

    /// Whether the code stops the account (`denials`).
    package var isDenial: Bool { Self.denials.contains(code) }

    /// Whether the IdP says the failure is its own (`serverErrors`): transient whatever the
    /// HTTP status, for endpoints whose statuses otherwise mean a dead credential.
    package var isServerError: Bool { Self.serverErrors.contains(code) }

    /// Whether the code faults the client's settings (`clientErrors`).
    package var rejectsClient: Bool { Self.clientErrors.contains(code) }

    /// `code` or `code: description`, as the IdP wrote them. Not cleaned or cut here: the
    /// message it goes into is cleaned whole (`OutsideText`), the secrets redacted before the
    /// cut, so no part of a secret survives it.
    package var text: String { description.map { "\(code): \($0)" } ?? code }

    /// ` (text)`, as messages quote the IdP's error after the HTTP status.
    package var quoted: String { " (\(text))" }

    /// The code a message quotes: what follows its first `(` up to `:` or `)`. Messages quote
    /// the error before any other parenthesis, so a description that names a code is not taken
    /// for one.
    package static func code(quotedIn message: String) -> Substring? {
        guard let open = message.firstIndex(of: "(") else { return nil }
        return message[message.index(after: open)...].prefix { $0 != ":" && $0 != ")" }
    }
}
