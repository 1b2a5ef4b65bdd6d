import BrokerModel
import BrokerProtocol
import BrokerSecrets
import FoundationEssentials

/// The device authorization grant (RFC 8628): asks the IdP for a user code, tells the client
/// where the user enters it, and polls the token endpoint until the user approves, denies, or
/// the code expires.
package enum DeviceAuthorization {
    package static let grantType = "urn:ietf:params:oauth:grant-type:device_code"
    /// Seconds between polls when the IdP names no interval (RFC 8628 section 3.2).
    package static let defaultInterval = 5
    package static let intervals = 1...300
    package static let lifetimes = 1...3600
    /// Longest user code shown, in characters.
    package static let maximumUserCode = 64
    /// Longest device code sent back, in bytes.
    package static let maximumDeviceCode = 4096

    /// What the device authorization endpoint answered, checked.
    package struct Offer: Equatable {
        /// The secret the token endpoint takes for the user's sign-in, in guarded memory.
        package var deviceCode: SecretBytes
        package var userCode: String
        package var verificationURI: String
        package var verificationURIComplete: String?
        package var expiresIn: Int
        package var interval: Int
    }

    /// Runs the grant; waits at most `timeout` seconds (or until the code expires, if sooner).
    package static func run(_ context: LoginContext, timeout: TimeInterval?) async throws(BrokerFailure) -> Grant {
        guard
            let endpoint = try await context.endpoint(
                context.settings.deviceAuthorizationEndpoint, discovered: \.deviceAuthorization)
        else {
            throw context.noEndpoint(for: .device, accountExists: context.accountExists)
        }
        let started = context.clock.now()
        var form: [(String, String)] = []
        if let scope = context.settings.scope { form.append(("scope", scope)) }
        // RFC 8628 section 3.1 wants the client id in the form: `post` puts it there for every
        // client authentication but Basic, which carries it in a header only.
        if context.settings.clientAuth == .clientSecretBasic { form.append(("client_id", context.settings.clientID)) }
        let offer: Offer
        switch await context.post(form, to: endpoint) {
        case .success(let reply): offer = try read(reply, context: context)
        case .failure(let failure): throw .loginUnavailable(reason: context.clean(failure.message))
        }
        await context.progress(
            LoginProgress(
                event: .deviceCode, verificationURI: offer.verificationURI,
                verificationURIComplete: offer.verificationURIComplete, userCode: offer.userCode,
                expiresIn: offer.expiresIn, interval: offer.interval,
                qrCode: QRMatrix.rows(of: offer.verificationURIComplete ?? offer.verificationURI)))
        let wait = min(Double(offer.expiresIn), timeout ?? .infinity)
        let deadline = LoginDeadline(at: started.addingTimeInterval(wait), on: context.clock)
        return try await poll(offer, until: deadline, context: context)
    }

    /// Polls the token endpoint at the offer's interval until the user acts or `deadline`.
    private static func poll(_ offer: Offer, until deadline: LoginDeadline, context: LoginContext)
        async throws(BrokerFailure) -> Grant
    {
        var interval = offer.interval
        var lastTransient: String?
        while true {
            let next = LoginDeadline(in: Double(interval), on: context.clock)
            guard next.date < deadline.date else {
                try await context.sleep(until: deadline)
                if let lastTransient { throw .loginUnavailable(reason: lastTransient) }
                throw .loginFailed(context.account, reason: "the sign-in was not completed in time")
            }
            try await context.sleep(until: next)
            let reply: IdPReply
            do throws(BrokerFailure) {
                // The form is built for each poll: the device code leaves guarded memory only for it.
                reply = try await context.tokenEndpointReply([
                    ("grant_type", grantType), ("device_code", offer.deviceCode.text),
                ])
            } catch .loginUnavailable(let reason) {
                lastTransient = reason
                continue
            }
            let error = OAuthError(reply)
            if reply.status == 400 || reply.status == 401 {
                switch error?.code {
                case "authorization_pending":
                    lastTransient = nil
                    continue
                case "slow_down":
                    lastTransient = nil
                    interval = min(interval + 5, intervals.upperBound)
                    await context.progress(LoginProgress(event: .slowDown, interval: interval))
                    continue
                case "access_denied":
                    throw .loginFailed(
                        context.account, reason: "the sign-in was denied at the IdP\(context.quoted(error))")
                case "expired_token":
                    throw .loginFailed(
                        context.account,
                        reason: "the code expired before the sign-in was completed\(context.quoted(error))")
                default:
                    break
                }
            }
            do throws(BrokerFailure) {
                return try context.grant(from: reply, refusal: "the device code")
            } catch .loginUnavailable(let reason) {
                lastTransient = reason
            }
        }
    }

    /// Checks the device authorization answer (RFC 8628 section 3.2): everything shown to the
    /// user is bounded and printable, the verification URI is https (or http on loopback).
    package static func read(_ reply: IdPReply, context: LoginContext) throws(BrokerFailure) -> Offer {
        guard (200..<300).contains(reply.status) else {
            if reply.status == 400 || reply.status == 401 { throw context.refused("the device authorization", reply) }
            let quoted = context.quoted(OAuthError(reply))
            throw .loginUnavailable(reason: "the device authorization endpoint answered HTTP \(reply.status)\(quoted)")
        }
        let malformed = { (field: String) -> BrokerFailure in
            .loginUnavailable(reason: "the device authorization endpoint answered an unusable \(field)")
        }
        guard let object = JSONValue.object(decoding: reply.body) else { throw malformed("answer (not a JSON object)") }
        guard let deviceCode = object["device_code"]?.text, !deviceCode.isEmpty,
            deviceCode.utf8.count <= maximumDeviceCode
        else { throw malformed("device_code") }
        guard let userCode = object["user_code"]?.text, isPrintable(userCode, upTo: maximumUserCode) else {
            throw malformed("user_code")
        }
        // Google calls it `verification_url`.
        guard let verification = (object["verification_uri"] ?? object["verification_url"])?.text,
            let verificationURI = shownURL(verification)
        else { throw malformed("verification_uri (https, or http on loopback)") }
        guard let expiresIn = seconds(object["expires_in"], in: lifetimes) else { throw malformed("expires_in") }
        let interval: Int
        if (object["interval"] ?? .null) == .null {
            interval = defaultInterval
        } else {
            guard let given = seconds(object["interval"], in: intervals) else { throw malformed("interval") }
            interval = given
        }
        return Offer(
            deviceCode: try SecretBytes(deviceCode), userCode: userCode, verificationURI: verificationURI,
            verificationURIComplete: (object["verification_uri_complete"]?.text).flatMap(shownURL),
            expiresIn: expiresIn, interval: interval)
    }

    /// A URL the user is sent to: https (or http on loopback), printable, at most 2048 bytes.
    package static func shownURL(_ text: String) -> String? {
        guard isPrintable(text, upTo: 2048), let url = URL(string: text), EndpointPolicy.isAllowed(url) else {
            return nil
        }
        return text
    }

    /// Whether `text` is 1 to `limit` printable ASCII characters.
    private static func isPrintable(_ text: String, upTo limit: Int) -> Bool {
        !text.isEmpty && text.utf8.count <= limit && text.utf8.allSatisfy { $0 >= 0x20 && $0 < 0x7F }
    }

    /// Whole seconds from a JSON number (or numeric string) within `range`.
    private static func seconds(_ value: JSONValue?, in range: ClosedRange<Int>) -> Int? {
        let number: Double?
        switch value {
        case .number(let double)?: number = double
        case .string(let text)?: number = Double(text)
        default: number = nil
        }
        guard let number, number.isFinite, number >= Double(range.lowerBound), number <= Double(range.upperBound)
        else { return nil }
        return Int(number.rounded(.down))
    }
}
