import BrokerModel
import BrokerSecrets
import FoundationEssentials
import NIOHTTP1
import Synchronization

/// Ties a browser login to the one browser that starts it (protocol/PROTOCOL.md section 6,
/// `login`, browser flow). The client is given `/start?k=KEY`, a link whose key travels only
/// over the broker's socket; the first visit with the key gets a cookie and the redirect to the
/// IdP, so the authorization URL (its `state` and `code_challenge`) never has to be in any
/// process's arguments. Only a callback carrying that cookie ends the wait: another process
/// that learns the `state` cannot finish the login with a code of its own.
package final class BrowserBinding: Sendable {
    /// The start link's key: 32 random bytes, base64url.
    package let key = Base64URL.encode(Sodium.randomBytes(32))
    /// The cookie's value: 32 random bytes, base64url.
    private let cookie = Base64URL.encode(Sodium.randomBytes(32))
    /// When the login ends (the cookie's lifetime).
    private let deadline: LoginDeadline
    /// Set once the listener is bound: where `/start` sends the browser, the cookie's name, and
    /// whether a browser has started.
    private let flow = Mutex<(authorizationURL: String, cookieName: String, started: Bool)?>(nil)

    package init(until deadline: LoginDeadline) {
        self.deadline = deadline
    }

    /// Makes `/start` send the browser to `authorizationURL`. The cookie's name carries the
    /// port, since browsers send a host's cookies to all its ports and two logins may run at once.
    package func arm(port: Int, authorizationURL: String) {
        flow.withLock { $0 = (authorizationURL, "tokenbroker_login_\(port)", false) }
    }

    /// The answer to `GET /start` with `key` and the request's `Cookie` headers: the first visit
    /// with the right key gets the cookie and the redirect to the IdP, later ones the redirect
    /// only when they carry the cookie (the same browser, reloading); a wrong key is not found.
    package func start(key given: String?, cookies: [String]) -> LoopbackReply {
        guard let given, Self.equal(given, key) else { return .notFound }
        let remaining = max(1, Int(deadline.remaining.rounded(.down)))
        let outcome = flow.withLock { flow -> (url: String, setCookie: String?)? in
            guard let current = flow else { return nil }
            if !current.started {
                flow?.started = true
                let attributes = "HttpOnly; SameSite=Lax; Path=/; Max-Age=\(remaining)"
                return (current.authorizationURL, "\(current.cookieName)=\(cookie); \(attributes)")
            }
            return carries(cookies, name: current.cookieName) ? (current.authorizationURL, nil) : nil
        }
        guard let outcome else {
            return LoopbackReply(
                .forbidden,
                "This sign-in was already opened in another browser; finish it there, or run brokerctl login again.")
        }
        var headers = [("Location", outcome.url)]
        if let setCookie = outcome.setCookie { headers.append(("Set-Cookie", setCookie)) }
        return LoopbackReply(.found, "Continue to the sign-in page.", headers: headers)
    }

    /// Whether a request's `Cookie` headers hold the cookie `/start` set (compared in constant time).
    package func isFromTheStartingBrowser(cookies: [String]) -> Bool {
        guard let name = flow.withLock({ $0?.started == true ? $0?.cookieName : nil }) else { return false }
        return carries(cookies, name: name)
    }

    private func carries(_ headers: [String], name: String) -> Bool {
        // RFC 6265 section 5.4: `name=value` pairs separated by "; ", possibly over several headers.
        var found = false
        for header in headers {
            for pair in header.split(separator: ";") {
                let parts = pair.drop { $0 == " " || $0 == "\t" }.split(
                    separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
                if parts.count == 2, parts[0] == name, Self.equal(String(parts[1]), cookie) { found = true }
            }
        }
        return found
    }

    /// Whether `lhs` and `rhs` are equal, in time that depends only on their lengths.
    private static func equal(_ lhs: String, _ rhs: String) -> Bool {
        let (left, right) = (Array(lhs.utf8), Array(rhs.utf8))
        return left.count == right.count && Sodium.constantTimeEqual(left, right, count: left.count)
    }
}
