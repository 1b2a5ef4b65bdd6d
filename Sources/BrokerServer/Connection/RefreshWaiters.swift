import BrokerEngine
import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import BrokerVault
import FoundationEssentials
import NIOCore
import Synchronization

/// `token` requests that missed the cache, and `reject`s of an account's token, held on their
/// connections' event loops while one fetch per account, `min_ttl` and token rejected waits for
/// the refresh they share.
///
/// When the fetch ends, each event loop gets one task that answers every request waiting on
/// it: a thousand clients of an expired token cost one wake-up per loop, not a task each that
/// then hops to its loop with its answer.
final class RefreshWaiters: Sendable {
    /// What the waiting requests are answered with: a failure is encoded once for them all.
    typealias Outcome = Result<PreparedToken, SharedErrorLine>

    /// The requests one fetch answers: the same account and the same `min_ttl`, and for a
    /// `reject` the same token rejected.
    struct Key: Hashable, Sendable {
        let account: String
        let minTTL: TimeInterval
        /// The access token a `reject` names; `nil` for a `token` request.
        var rejected: String? = nil
    }

    /// A waiting request, by which its connection can drop it.
    struct Ticket: Hashable, Sendable {
        let key: Key
        let serial: UInt64
    }

    private struct Waiter: Sendable {
        let serial: UInt64
        let loop: any EventLoop
        /// Runs on `loop` only.
        let answer: NIOLoopBound<(Ticket, Outcome) -> Void>
    }

    private struct State {
        var waiting: [Key: [Waiter]] = [:]
        var nextSerial: UInt64 = 0
    }

    private let state = Mutex(State())

    init() {}

    /// Holds `answer` (run on `loop` with the request's ticket and the outcome) until the fetch
    /// for `key` ends; starts that fetch with `fetch` when no request for `key` waits yet.
    func wait(
        for key: Key, on loop: any EventLoop, answer: @escaping (Ticket, Outcome) -> Void,
        fetch: @escaping @Sendable () async -> Outcome
    ) -> Ticket {
        let answer = NIOLoopBound(answer, eventLoop: loop)
        let (serial, isFirst) = state.withLock { state in
            state.nextSerial += 1
            let isFirst = state.waiting[key] == nil
            state.waiting[key, default: []].append(Waiter(serial: state.nextSerial, loop: loop, answer: answer))
            return (state.nextSerial, isFirst)
        }
        if isFirst {
            // Not tied to the connection that came first: the fetch answers every waiter.
            Task { self.deliver(await fetch(), to: key) }
        }
        return Ticket(key: key, serial: serial)
    }

    /// Drops the request `ticket` stands for (its connection closed); its fetch goes on for
    /// the others.
    func cancel(_ ticket: Ticket) {
        state.withLock { state in
            state.waiting[ticket.key]?.removeAll { $0.serial == ticket.serial }
        }
    }

    /// Requests waiting now, for tests.
    var count: Int { state.withLock { $0.waiting.values.reduce(0) { $0 + $1.count } } }

    /// Answers every request waiting for `key` with `outcome`, one task per event loop. A
    /// request that comes after this starts a fetch of its own (which finds the cache filled).
    private func deliver(_ outcome: Outcome, to key: Key) {
        let waiters = state.withLock { $0.waiting.removeValue(forKey: key) } ?? []
        var byLoop: [ObjectIdentifier: [Waiter]] = [:]
        for waiter in waiters { byLoop[ObjectIdentifier(waiter.loop), default: []].append(waiter) }
        for group in byLoop.values {
            group[0].loop.execute {
                for waiter in group { waiter.answer.value(Ticket(key: key, serial: waiter.serial), outcome) }
            }
        }
    }
}
