import BrokerProtocol

extension BrokerCall where Result == LockResult {
    /// Unlocks a broker in passphrase mode (owner only); the first unlock of a broker with no
    /// vault yet sets the passphrase.
    public static func unlock(passphrase: String) -> Self {
        var request = Request(id: nil, op: "unlock")
        request.passphrase = passphrase
        return Self(request)
    }

    /// Makes the broker forget its vault key and every decrypted secret (owner only).
    public static func lock() -> Self { Self(Request(id: nil, op: "lock")) }
}

extension BrokerCall where Result == RekeyResult {
    /// Seals the vault under a new passphrase, or under the key file when `passphrase` is `nil`
    /// (owner only).
    public static func rekey(passphrase: String?) -> Self {
        var request = Request(id: nil, op: "rekey")
        request.to = passphrase == nil ? "keyfile" : "passphrase"
        request.passphrase = passphrase
        return Self(request)
    }
}
