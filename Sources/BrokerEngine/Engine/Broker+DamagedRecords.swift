import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import BrokerVault
import FoundationEssentials
import Logging

/// Damaged records: account objects in the vault that this release cannot read, kept byte for
/// byte (protocol/VAULT.md, "Records of other releases"). Each is shown by `status` as `damaged`
/// with the reason, refused to every other request with an error naming it, and deleted by
/// `remove`; no account of its name is created meanwhile, which would replace it.
extension Broker {
    /// The damaged records of `contents`, each logged by name and reason (never its text).
    package static func damaged(in contents: VaultContents?, now: Date, logger: Logger) -> [String: (
        record: DamagedRecord, since: Date
    )] {
        var damaged: [String: (record: DamagedRecord, since: Date)] = [:]
        for record in contents?.damaged ?? [] {
            logger.error(
                "an account's record in the vault cannot be read; it is kept as it is and not served",
                metadata: ["account": "\(record.name)", "reason": "\(record.reason)"])
            damaged[record.name] = (record, now)
        }
        return damaged
    }

    /// Refuses `name` when its record is damaged.
    package func checkNotDamaged(_ name: String) throws(BrokerFailure) {
        guard let record = damaged[name]?.record else { return }
        throw .damaged(AccountName(known: name), reason: record.reason)
    }

    /// What `status` shows of a damaged record loaded at `since`: the reason as its last error.
    package func describe(_ record: DamagedRecord, since: Date) -> AccountSnapshot {
        AccountSnapshot(
            name: AccountName(known: record.name), kind: "unknown", state: .damaged,
            lastError: AccountError(code: AccountState.damaged.rawValue, message: record.reason, at: since),
            restoration: .removeDamaged)
    }

    /// Deletes the damaged record `account` from the vault.
    package func removeDamaged(_ account: AccountName) throws(BrokerFailure) {
        let name = account.rawValue
        try persist(changing: [name])
        damaged[name] = nil
        logger.info("damaged account removed", metadata: ["account": "\(name)"])
        events.publish(AccountEvent(kind: .removed, account: account, at: clock.now()))
    }
}
