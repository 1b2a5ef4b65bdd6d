import BrokerModel
import BrokerProtocol
import BrokerSecrets
import FoundationEssentials

/// The authorization code grant with PKCE S256 (RFC 7636) and a loopback redirect (RFC 8252):
/// the client opens the listener's start link in a browser, which the listener sends on to the
/// authorization URL; the IdP sends the browser back to the listener with a code, and the
/// broker exchanges the code with its verifier.
package enum AuthorizationCodeLogin {
    /// Runs the grant and hands the tokens to `keep` (which stores them); waits at most
    /// `timeout` seconds for the browser to come back. The listener is closed on every path,
    /// after the browser that brought a code was told how its exchange and `keep` went. Runs
    /// on the caller's actor, as `keep` does.
    package static func run<Kept>(
        _ context: LoginContext, redirectPort: Int?, timeout: TimeInterval?,
        isolation: isolated (any Actor)? = #isolation, keep: (Grant) throws(BrokerFailure) -> Kept
    ) async throws(BrokerFailure) -> Kept {
        guard
            let endpoint = try await context.endpoint(
                context.settings.authorizationEndpoint, discovered: \.authorization)
        else {
            throw context.noEndpoint(for: .browser, accountExists: context.accountExists)
        }
        let pkce = try PKCE()
        let wait = timeout ?? LoginOptions.defaultTimeout
        let deadline = LoginDeadline(in: wait, on: context.clock)
        let listener = try await LoopbackRedirect(port: redirectPort ?? 0, state: pkce.state, until: deadline) {
            authorizationURL(
                endpoint, settings: context.settings, pkce: pkce, redirectURI: $0, dpopKey: context.dpopKey)
        }
        // The client gets the start link, not the authorization URL: it carries neither `state`
        // nor `code_challenge`, and only the browser that opens it can finish the login.
        await context.progress(
            LoginProgress(
                event: .authorizationURL, expiresIn: Bounds.wholeSeconds(wait), url: listener.startURL,
                redirectURI: listener.redirectURI))
        let callback = await listener.callback(until: deadline)
        // No more connections; the page of the browser that brought a code waits for the
        // outcome (the exchange, then the save), and says why the login failed, or that it did not.
        await listener.close()
        let outcome: Result<Kept, BrokerFailure>
        do throws(BrokerFailure) {
            outcome = .success(try keep(try await grant(callback, listener: listener, pkce: pkce, context: context)))
        } catch {
            outcome = .failure(error)
        }
        var reason: String?
        if case .failure(let failure) = outcome {
            let page = OutsideText(secrets: [context.clientSecret?.text], limit: LoopbackRedirect.maximumReason)
            reason = page.clean(failure.description, or: "no reason given")
        }
        await listener.finish(failure: reason)
        return try outcome.get()
    }

    /// The tokens the code of `callback` is exchanged for.
    private static func grant(
        _ callback: LoopbackRedirect.Callback?, listener: LoopbackRedirect, pkce: PKCE, context: LoginContext
    ) async throws(BrokerFailure) -> Grant {
        if Task.isCancelled { throw context.cancelled }
        switch callback {
        case nil:
            throw .loginFailed(context.account, reason: "the browser did not come back in time")
        case .error(let error):
            throw .loginFailed(context.account, reason: "the sign-in was denied at the IdP (\(context.clean(error)))")
        case .code(let code):
            return try await context.exchange(
                [
                    ("grant_type", "authorization_code"), ("code", code), ("redirect_uri", listener.redirectURI),
                    ("code_verifier", pkce.verifier.text),
                ], refusal: "the code exchange")
        }
    }

    /// `endpoint` with the request of RFC 6749 section 4.1.1 and RFC 7636 section 4.3 added to
    /// any query it has, and `dpop_jkt` (RFC 9449 section 10) for an account with a DPoP key.
    package static func authorizationURL(
        _ endpoint: URL, settings: OAuth2Settings, pkce: PKCE, redirectURI: String, dpopKey: DPoPKey? = nil
    ) -> String {
        var pairs = [
            ("response_type", "code"), ("client_id", settings.clientID), ("redirect_uri", redirectURI),
        ]
        if let scope = settings.scope { pairs.append(("scope", scope)) }
        pairs += [("state", pkce.state), ("code_challenge", pkce.challenge), ("code_challenge_method", "S256")]
        if let dpopKey { pairs.append(("dpop_jkt", dpopKey.thumbprint)) }
        let base = endpoint.absoluteString
        let separator = endpoint.query == nil ? "?" : "&"
        return base + separator + FormEncoding.encode(pairs)
    }
}
