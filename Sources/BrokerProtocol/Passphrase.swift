/// Passphrase mode on the wire: what a locked broker answers, and the results of `unlock`,
/// `lock` and `rekey`.

/// The longest passphrase `unlock` and `rekey` take, in bytes of UTF-8.
public let maximumPassphraseLength = 1024

extension Operation {
    /// Operations a locked broker runs; every other one is answered `locked`.
    public var runsWhileLocked: Bool {
        switch self {
        case .hello, .status, .lock, .unlock: return true
        default: return false
        }
    }
}

/// The result of `unlock` and `lock`: the broker's state afterwards.
public struct LockResult: Codable, Sendable, Equatable {
    /// `locked` or `unlocked`.
    public var state: String
    /// `unlock`: how many accounts the vault holds (absent when it was unlocked already).
    public var accounts: Int?
    /// `unlock`: `true` when there was no vault and this unlock set the passphrase; absent otherwise.
    public var created: Bool?

    public init(state: String, accounts: Int? = nil, created: Bool? = nil) {
        self.state = state
        self.accounts = accounts
        self.created = created
    }
}

/// The result of `rekey`: the key the vault is sealed with now.
public struct RekeyResult: Codable, Sendable, Equatable {
    /// `passphrase` or `keyfile`.
    public var key: String
    /// A key file the vault no longer needs that brokerd could not remove (a systemd credential).
    public var keyFileLeft: String?

    public init(key: String, keyFileLeft: String? = nil) {
        self.key = key
        self.keyFileLeft = keyFileLeft
    }

    enum CodingKeys: String, CodingKey {
        case key
        case keyFileLeft = "key_file_left"
    }
}
