import BrokerModel
import BrokerSecrets
import FoundationEssentials

/// Makes text from outside (an IdP's message, a helper's stderr) safe to store, log and send:
/// every secret of the account replaced by `[redacted]`, line breaks and tabs turned into spaces,
/// other control and formatting characters (escape sequences, bidi overrides) dropped, runs of
/// spaces collapsed, and the result cut to `limit` characters.
package struct OutsideText {
    /// Longest text kept by default, in characters (an ellipsis marks a cut).
    package static let limit = 300
    package static let placeholder = "[redacted]"

    /// The secrets to hide, longest first, each also in its form-encoded spelling (as an IdP
    /// echoing a request body would write it).
    private let secrets: [String]
    /// Longest text kept, in characters.
    private let limit: Int

    package init(secrets: [String?], limit: Int = Self.limit) {
        self.limit = limit
        let given = secrets.compactMap { $0 }.filter { !$0.isEmpty }
        self.secrets = Set(given + given.map(FormEncoding.escape)).filter { !$0.isEmpty }
            .sorted { $0.count > $1.count }
    }

    /// `text` cleaned; `nil` when nothing printable is left.
    package func clean(_ text: String) -> String? {
        // Redacted before and after the control characters go, so neither a secret split by
        // one nor a secret next to one survives.
        var flattened = String.UnicodeScalarView()
        for scalar in redact(text).unicodeScalars {
            switch scalar.properties.generalCategory {
            case _ where scalar == "\n" || scalar == "\r" || scalar == "\t": flattened.append(" ")
            case .lineSeparator, .paragraphSeparator: flattened.append(" ")
            case .control, .format: continue
            default: flattened.append(scalar)
            }
        }
        let line = redact(String(flattened)).split(separator: " ", omittingEmptySubsequences: true).joined(
            separator: " ")
        guard !line.isEmpty else { return nil }
        return line.count > limit ? String(line.prefix(limit)) + "…" : line
    }

    /// `text` cleaned, or `fallback` when nothing printable is left.
    package func clean(_ text: String, or fallback: String) -> String { clean(text) ?? fallback }

    /// `failure` with its message cleaned.
    package func clean(_ failure: RefreshFailure) -> RefreshFailure {
        var cleaned = failure
        cleaned.message = clean(failure.message, or: "no reason given")
        return cleaned
    }

    private func redact(_ text: String) -> String {
        secrets.reduce(text) { $0.replacing($1, with: Self.placeholder) }
    }
}

extension AccountRecord {
    /// Cleans outside text of this account's secrets: refresh token, refresh URL, client
    /// secret, access token and ID token, plus any `extra` (e.g. tokens just issued).
    package func outsideText(alsoHiding extra: [String?] = []) -> OutsideText {
        OutsideText(
            secrets: [
                secrets.refreshToken?.text, secrets.refreshURL?.text, secrets.clientSecret?.text, token?.value.text,
                token?.idToken?.text,
            ]
                + extra)
    }
}
