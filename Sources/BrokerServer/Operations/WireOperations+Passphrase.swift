import BrokerEngine
import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import BrokerVault
import FoundationEssentials

/// The passphrase-mode operations as the protocol states them (see `WireOperations`).
extension WireOperations {
    /// `unlock`; the passphrase goes into guarded memory at once and is wiped when the call ends.
    public func unlock(passphrase: String?) async throws(BrokerError) -> LockResult {
        do {
            switch try await broker.unlock(with: try passphrase.map(SecretBytes.init)) {
            case .alreadyUnlocked:
                return LockResult(state: "unlocked")
            case .unlocked(let accounts, let created):
                return LockResult(state: "unlocked", accounts: accounts, created: created ? true : nil)
            }
        } catch {
            throw BrokerError(error)
        }
    }

    /// `lock`.
    public func lockVault() async throws(BrokerError) -> LockResult {
        do {
            _ = try await broker.lock()
        } catch {
            throw BrokerError(error)
        }
        return LockResult(state: "locked")
    }

    /// `rekey`: `to` is `passphrase` (with `passphrase`, into guarded memory at once) or `keyfile`.
    public func rekey(to: String?, passphrase: String?) async throws(BrokerError) -> RekeyResult {
        guard let to, let mode = VaultKeyMode(rawValue: to) else {
            throw BrokerError(.badRequest, "\"to\" must be \"passphrase\" or \"keyfile\"")
        }
        do {
            return RekeyResult(
                key: mode.rawValue,
                keyFileLeft: try await broker.rekey(to: mode, passphrase: try passphrase.map(SecretBytes.init))
            )
        } catch {
            throw BrokerError(error)
        }
    }

    /// `status` while locked: the accounts the broker held when it locked and those broker.toml
    /// declares, each in state `locked` with its provider kind (no secret is needed for them).
    func lockedStatus(account: String?) throws(BrokerError) -> [AccountStatus] {
        let statuses = broker.padlock.lockedAccounts.map {
            AccountStatus(account: $0.name, provider: $0.kind, state: "locked")
        }
        guard let account else { return statuses }
        guard let status = statuses.first(where: { $0.account == account }) else {
            throw WireTranslation.noSuchAccount(account)
        }
        return [status]
    }
}
