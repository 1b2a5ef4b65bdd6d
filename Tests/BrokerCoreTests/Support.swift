@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
import BrokerProtocol
@testable import BrokerSecrets
@testable import BrokerVault
import Foundation
import Logging
import Synchronization

extension AccountRecord {
    /// A record with every field set, for vault round trips.
    static func sample(_ name: String, refreshToken: String = "rt-\(UUID().uuidString)") -> AccountRecord {
        let obtained = Date(timeIntervalSince1970: 1_795_000_000)
        return AccountRecord(
            name: name,
            provider: ProviderConfig(
                OAuth2Settings(
                    tokenEndpoint: URL(string: "https://idp.example/oauth/token")!, clientID: "client-\(name)",
                    clientAuth: .clientSecretBasic, scope: "read write")),
            secrets: AccountSecrets(
                refreshToken: try! SecretBytes(refreshToken), refreshExpiresAt: obtained.addingTimeInterval(86_400),
                clientSecret: try! SecretBytes("cs-\(UUID().uuidString)")),
            token: AccessToken(
                value: try! SecretBytes("at-\(UUID().uuidString)"), type: "Bearer",
                expiresAt: obtained.addingTimeInterval(3600),
                obtainedAt: obtained, idToken: try! SecretBytes("id.token.\(name)"), scope: "read"),
            needsLogin: false,
            lastError: AccountError(code: "unavailable", message: "HTTP 503", at: obtained.addingTimeInterval(-60)),
            lastRefreshAt: obtained)
    }
}

extension RefreshPlanner {
    /// The default settings without jitter, so that every schedule is exact.
    static let withoutJitter: RefreshPlanner = {
        var settings = BrokerSettings()
        settings.refreshJitter = 0
        return RefreshPlanner(settings: settings)
    }()
}
