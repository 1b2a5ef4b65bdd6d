import FoundationEssentials

/// One change in an account's life, as a `subscribe` connection receives it. Never carries a token.
public struct BrokerEvent: Codable, Sendable, Equatable {
    /// The kinds of event of protocol v1.
    public enum Kind: String, Codable, Sendable, CaseIterable {
        case refreshed
        case refreshFailed = "refresh_failed"
        case needsLogin = "needs_login"
        case loggedOut = "logged_out"
        case added, removed
        /// The account serves a token again after `needs_login`, `logged_out` or `refresh_failed`.
        case valid
    }

    public var event: Kind
    public var account: String
    public var at: Date
    /// The account's state after the change.
    public var state: String?
    /// What went wrong (`refresh_failed`, `needs_login`), for people.
    public var message: String?
    /// When the new access token expires (`refreshed`, `valid`).
    public var expiresAt: Date?

    public init(
        event: Kind, account: String, at: Date, state: String? = nil, message: String? = nil, expiresAt: Date? = nil
    ) {
        self.event = event
        self.account = account
        self.at = at
        self.state = state
        self.message = message
        self.expiresAt = expiresAt
    }

    enum CodingKeys: String, CodingKey {
        case event, account, at, state, message
        case expiresAt = "expires_at"
    }
}

/// An event line: the subscribe request's id followed by the event's fields.
public struct EventLine: Encodable {
    public var id: RequestID
    public var event: BrokerEvent

    public init(id: RequestID, event: BrokerEvent) {
        self.id = id
        self.event = event
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(id, forKey: .id)
        try event.encode(to: encoder)
    }

    enum CodingKeys: String, CodingKey { case id }
}

/// The result of `subscribe`: the accounts whose events will follow (`nil`: all of them).
public struct SubscribeResult: Codable, Sendable, Equatable {
    public var accounts: [String]?
    /// Events buffered for a slow reader before the subscription is dropped.
    public var buffer: Int

    public init(accounts: [String]?, buffer: Int) {
        self.accounts = accounts
        self.buffer = buffer
    }
}
