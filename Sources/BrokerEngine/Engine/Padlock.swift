import BrokerIdP
import BrokerModel
import BrokerSecrets
import BrokerVault
import FoundationEssentials
import Synchronization

/// Whether the broker holds its vault key (passphrase mode), readable from any thread; what
/// `status` shows while it does not; and the pace of unlock attempts.
public final class Padlock: Sendable {
    /// Where the broker stands.
    public enum Phase: Sendable, Equatable {
        case unlocked
        /// A `lock` is waiting for refreshes under way to be saved before it forgets the key.
        case locking
        case locked
    }

    /// An account as `status` shows it while the broker is locked: no secret is needed for it.
    public struct LockedAccount: Sendable, Equatable {
        public var name: String
        public var kind: String
    }

    /// The longest wait after a wrong passphrase.
    package static let longestDelay: Duration = .seconds(30)

    private let state = Mutex(State())

    private struct State {
        var phase = Phase.unlocked
        /// The accounts the broker held when it locked.
        var known: [LockedAccount] = []
        /// The accounts broker.toml declares, given while locked.
        var declared: [LockedAccount] = []
        var newVault = false
        /// Wrong passphrases in a row.
        var failures = 0
        /// When the delay of a wrong passphrase given before a restart ends (`restore(_:)`).
        var restoredUntil: Date?
        /// Whether an unlock or a rekey is deriving a key (or waiting out a wrong passphrase's delay).
        var deriving = false
    }

    public init() {}

    public var phase: Phase { state.withLock { $0.phase } }

    /// Whether every op but `hello`, `status`, `lock` and `unlock` is refused.
    public var isLocked: Bool { phase != .unlocked }

    /// The accounts `status` shows while locked, sorted by name: those the broker held when it
    /// locked, and those broker.toml declares.
    public var lockedAccounts: [LockedAccount] {
        state.withLock { state in
            let names = Set(state.known.map(\.name))
            return (state.known + state.declared.filter { !names.contains($0.name) }).sorted { $0.name < $1.name }
        }
    }

    /// Whether the broker is locked with no vault yet: the first unlock sets the passphrase.
    public var newVault: Bool { state.withLock { $0.phase != .unlocked && $0.newVault } }

    /// Moves to `phase`; `known` are the accounts the broker holds as it locks.
    package func enter(_ phase: Phase, known: [LockedAccount] = [], newVault: Bool = false) {
        state.withLock {
            $0.phase = phase
            $0.known = known
            $0.declared = []
            $0.newVault = newVault
        }
    }

    /// The accounts broker.toml declares, shown while locked.
    package func declare(_ accounts: [LockedAccount]) {
        state.withLock { $0.declared = accounts }
    }

    /// Starts a key derivation (an unlock or a rekey: a second or so and 256 MiB) unless one is
    /// under way; returns whether it started.
    package func beginDerivation() -> Bool {
        state.withLock { state in
            guard !state.deriving else { return false }
            state.deriving = true
            return true
        }
    }

    package func endDerivation() {
        state.withLock { $0.deriving = false }
    }

    /// Counts a wrong passphrase; returns how long to wait before answering it: 1 s, doubling
    /// with each wrong one in a row, at most 30 s.
    package func failed() -> Duration {
        state.withLock { state in
            state.failures += 1
            return Self.delay(afterFailures: state.failures)
        }
    }

    /// An unlock succeeded: the next wrong passphrase waits 1 s again.
    package func succeeded() {
        state.withLock {
            $0.failures = 0
            $0.restoredUntil = nil
        }
    }

    /// Wrong passphrases in a row.
    package var failures: Int { state.withLock { $0.failures } }

    /// Takes up the pace a previous run of brokerd left (`UnlockPaceFile`).
    package func restore(_ pace: UnlockPaceFile.Pace) {
        state.withLock { state in
            state.failures = pace.failures
            state.restoredUntil = pace.until
        }
    }

    /// How long the first unlock after `restore(_:)` waits before it tries its passphrase at
    /// `now`: what is left of the delay that a restart cut short. Zero once taken.
    package func takeRestoredWait(now: Date) -> Duration {
        state.withLock { state in
            defer { state.restoredUntil = nil }
            let left = state.restoredUntil.map { $0.timeIntervalSince(now) } ?? 0
            let longest = Double(Self.longestDelay.components.seconds)
            return left > 0 ? .milliseconds(Int64((min(left, longest) * 1000).rounded(.up))) : .zero
        }
    }

    package static func delay(afterFailures failures: Int) -> Duration {
        min(longestDelay, .seconds(1 << min(max(failures - 1, 0), 5)))
    }
}
