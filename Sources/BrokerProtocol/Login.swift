import FoundationEssentials

/// The grants `login` can run.
public enum LoginFlow: String, Sendable, CaseIterable, Codable {
    /// The device authorization grant (RFC 8628): the user enters a code on another device.
    case device
    /// The authorization code grant with PKCE (RFC 7636) and a loopback redirect (RFC 8252).
    case browser
}

/// What a running `login` tells its client before the final line: what to show the user.
/// A progress line has `event` and never `ok`; the final line has `ok`.
public struct LoginProgress: Codable, Sendable, Equatable {
    /// The kinds of progress of protocol v1.
    public enum Kind: String, Codable, Sendable, CaseIterable {
        /// Device flow: where to go and which code to enter.
        case deviceCode = "device_code"
        /// Device flow: the IdP asked the broker to poll less often; `interval` is the new one.
        case slowDown = "slow_down"
        /// Browser flow: the URL to open, and where the broker waits for the redirect.
        case authorizationURL = "authorization_url"
        /// A login of the account was already running and this one joined it: `flow` is that
        /// login's, whose progress so far follows. Only the client that started it opens a browser.
        case joined
    }

    public var event: Kind
    /// `device_code`: the page where the user enters `userCode`.
    public var verificationURI: String?
    /// `device_code`: the page with the code filled in, when the IdP gives one.
    public var verificationURIComplete: String?
    /// `device_code`: the code the user enters.
    public var userCode: String?
    /// `device_code`, `authorization_url`: seconds left for the user to act.
    public var expiresIn: Int?
    /// `device_code`, `slow_down`: seconds between two polls of the token endpoint.
    public var interval: Int?
    /// `authorization_url`: the URL the user opens in a browser: the broker's one-time start
    /// link, which leads to the IdP (the authorization URL itself stays in the broker).
    public var url: String?
    /// `authorization_url`: the loopback URL the browser is sent back to.
    public var redirectURI: String?
    /// `device_code`: the QR code of `verificationURIComplete` (else of `verificationURI`), as
    /// rows of `1` (dark) and `0`, without the quiet zone; a phone's camera opens it.
    public var qrCode: [String]?
    /// `joined`: the flow of the running login.
    public var flow: LoginFlow?

    public init(
        event: Kind, verificationURI: String? = nil, verificationURIComplete: String? = nil, userCode: String? = nil,
        expiresIn: Int? = nil, interval: Int? = nil, url: String? = nil, redirectURI: String? = nil,
        qrCode: [String]? = nil, flow: LoginFlow? = nil
    ) {
        self.event = event
        self.verificationURI = verificationURI
        self.verificationURIComplete = verificationURIComplete
        self.userCode = userCode
        self.expiresIn = expiresIn
        self.interval = interval
        self.url = url
        self.redirectURI = redirectURI
        self.qrCode = qrCode
        self.flow = flow
    }

    enum CodingKeys: String, CodingKey {
        case event, interval, url, flow
        case qrCode = "qr_code"
        case verificationURI = "verification_uri"
        case verificationURIComplete = "verification_uri_complete"
        case userCode = "user_code"
        case expiresIn = "expires_in"
        case redirectURI = "redirect_uri"
    }
}

/// A progress line: the login request's id followed by the progress fields.
public struct LoginProgressLine: Encodable {
    public var id: RequestID
    public var progress: LoginProgress

    public init(id: RequestID, progress: LoginProgress) {
        self.id = id
        self.progress = progress
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(id, forKey: .id)
        try progress.encode(to: encoder)
    }

    enum CodingKeys: String, CodingKey { case id }
}

/// The result of `login`: the account holds the new tokens, durably saved.
public struct LoginResult: Codable, Sendable, Equatable {
    public var account: String
    public var state: String
    /// Whether the IdP issued an id token (`token` with `"id_token": true` answers it).
    public var idToken: Bool

    public init(account: String, state: String, idToken: Bool) {
        self.account = account
        self.state = state
        self.idToken = idToken
    }

    enum CodingKeys: String, CodingKey {
        case account, state
        case idToken = "id_token"
    }
}

/// The result of `token` with `"id_token": true`: the account's id token and, when its JWT
/// payload states one, its expiry.
public struct IDTokenResult: Codable, Sendable, Equatable {
    public var account: String
    public var idToken: String
    /// The payload's `exp`; absent when unreadable.
    public var expiresAt: Date?
    public var expiresIn: Int?

    public init(account: String, idToken: String, expiresAt: Date? = nil, expiresIn: Int? = nil) {
        self.account = account
        self.idToken = idToken
        self.expiresAt = expiresAt
        self.expiresIn = expiresIn
    }

    enum CodingKeys: String, CodingKey {
        case account
        case idToken = "id_token"
        case expiresAt = "expires_at"
        case expiresIn = "expires_in"
    }
}
