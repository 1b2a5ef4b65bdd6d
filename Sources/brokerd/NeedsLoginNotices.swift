import BrokerEngine
import BrokerIdP
import BrokerModel
import BrokerSecrets
import BrokerSystemd
import BrokerVault
import Logging
import NIOPosix
import ServiceLifecycle

#if canImport(Glibc)
import Glibc
#endif

/// A desktop notification when an account needs the user to sign in: once each time it enters
/// `needs_login` (a `logged_out` account was logged out by the user, who knows). It watches the
/// engine's events, as a subscriber would, and sends on a thread of its own, since a D-Bus call
/// blocks; nothing is sent without a session bus or with `desktop_notifications = false`. The
/// text names the account and the command its advice names (`status`'s `advice_command`: login,
/// set-tokens, update or refresh, whichever can work for it), never a token or what the IdP said.
struct NeedsLoginNotices: Service {
    let broker: Broker
    let notifications: DesktopNotifications
    let logger: Logger

    func run() async throws {
        let thread = NIOThreadPool(numberOfThreads: 1)
        thread.start()
        /// Accounts notified since they last served a token (or were added or removed).
        var notified: Set<String> = []
        while !Task.isCancelled {
            do {
                for try await event in broker.events.subscribe(accounts: nil).cancelOnGracefulShutdown() {
                    let name = event.account.rawValue
                    switch event.kind {
                    case .needsLogin:
                        guard notified.insert(name).inserted, broker.settings.desktopNotifications else { continue }
                        // An account removed since has nothing to advise: no notice.
                        guard let advice = try? await broker.snapshot(of: event.account).restoration else { continue }
                        let command = advice.command(for: name)
                        thread.submit { [notifications, logger] _ in
                            guard notifications.hasSessionBus else { return }
                            let result = notifications.show(
                                summary: "\(name) needs you",
                                body: "tokenbroker cannot refresh \(name): run \(command)")
                            if result < 0 {
                                logger.notice(
                                    "desktop notification not shown",
                                    metadata: ["account": "\(name)", "reason": "\(String(cString: strerror(-result)))"])
                            }
                        }
                    case .valid, .refreshed, .added, .removed, .loggedOut:
                        notified.remove(name)
                    case .refreshFailed:
                        break
                    }
                }
                break
            } catch is SubscriberTooSlow {
                continue
            }
        }
        try await thread.shutdownGracefully()
    }
}
