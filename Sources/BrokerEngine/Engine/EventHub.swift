import BrokerIdP
import BrokerModel
import BrokerSecrets
import BrokerVault
import FoundationEssentials
import Synchronization

/// Fans account events out to subscribers. Each subscriber has a bounded buffer; one that
/// falls behind is cut off (its stream ends with `SubscriberTooSlow`) instead of slowing the
/// broker or growing without limit.
public final class EventHub: Sendable {
    /// A subscription's events, finished with `SubscriberTooSlow` if its buffer overflowed.
    public typealias Events = AsyncThrowingStream<AccountEvent, any Error>

    /// Events a subscriber may have pending before it is dropped.
    public let bufferLimit: Int
    private let subscribers = Mutex<[Int: Subscriber]>([:])
    private let serial = Atomic<Int>(0)

    private struct Subscriber {
        var accounts: Set<String>?
        var continuation: Events.Continuation
    }

    public init(bufferLimit: Int = 1024) { self.bufferLimit = bufferLimit }

    /// Starts a subscription to `accounts` (all accounts when `nil`).
    public func subscribe(accounts: [String]?) -> Events {
        let id = serial.add(1, ordering: .relaxed).newValue
        let (stream, continuation) = Events.makeStream(bufferingPolicy: .bufferingOldest(bufferLimit))
        continuation.onTermination = { [weak self] _ in
            _ = self?.subscribers.withLock { $0.removeValue(forKey: id) }
        }
        subscribers.withLock {
            $0[id] = Subscriber(accounts: accounts.map(Set.init), continuation: continuation)
        }
        return stream
    }

    /// Number of live subscriptions.
    public var count: Int { subscribers.withLock { $0.count } }

    package func publish(_ event: AccountEvent) {
        let targets = subscribers.withLock { subscribers in
            subscribers.values.filter { $0.accounts?.contains(event.account.rawValue) ?? true }.map(\.continuation)
        }
        for continuation in targets {
            if case .dropped = continuation.yield(event) {
                continuation.finish(throwing: SubscriberTooSlow())
            }
        }
    }
}

/// The subscriber did not read its events fast enough and was dropped.
public struct SubscriberTooSlow: Error {}
