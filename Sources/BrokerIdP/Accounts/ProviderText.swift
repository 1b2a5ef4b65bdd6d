import BrokerModel
import BrokerSecrets
import FoundationEssentials

/// A record's `provider` object as the vault held it, kept when this release would write the
/// settings it read otherwise (a member of a later release that the provider kind does not
/// know): written back as it was for as long as the account keeps those settings
/// (protocol/VAULT.md, "Records of other releases"). In guarded memory, like the record's
/// other members of later releases.
public struct ProviderText: Sendable, Equatable {
    /// The settings read from `text`.
    package let config: ProviderConfig
    /// The object's JSON text as read.
    package let text: SecretBytes

    /// Every stored member, as the synthesized initializer (internal to its module) takes them.
    package init(config: ProviderConfig, text: SecretBytes) {
        self.config = config
        self.text = text
    }
}
