import BrokerEngine
import BrokerIdP
import BrokerModel
import BrokerSecrets
import BrokerVault
import Foundation

extension BrokerProcess {
    /// The DPoP private key of each account of the vault, as the vault keeps it (the scalar,
    /// base64url), read with the key file, so that a memory test knows what to search for. Only
    /// while brokerd is stopped: it holds the vault's lock while it runs.
    public func storedDPoPKeys() throws -> [String: String] {
        let vault = try Vault(path: vaultPath, key: VaultKey.load(path: keyPath, create: false))
        var keys: [String: String] = [:]
        for record in try vault.load()?.accounts ?? [] {
            guard let key = record.secrets.dpopKey else { continue }
            // The key's only way out is its Codable form, the vault's.
            let text = String(decoding: try JSONEncoder().encode(key), as: UTF8.self)
            keys[record.name] = String(text.dropFirst().dropLast())
        }
        return keys
    }

    /// The refresh token of each account of the vault, read with the key file, so that a test
    /// can compare it with its IdP's. Only while brokerd is stopped.
    public func storedRefreshTokens() throws -> [String: String] {
        let vault = try Vault(path: vaultPath, key: VaultKey.load(path: keyPath, create: false))
        var tokens: [String: String] = [:]
        for record in try vault.load()?.accounts ?? [] { tokens[record.name] = record.secrets.refreshToken?.text }
        return tokens
    }
}
