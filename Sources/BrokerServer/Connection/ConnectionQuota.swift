import Synchronization

/// What all connections hold together, counted against `ConnectionLimits`: connections,
/// running requests and subscriptions per uid, connections in all, and the shared budget for
/// received bytes that connections hold beyond their allowance.
///
/// Every `reserve` that succeeds is matched by exactly one `release` when the connection gives
/// the thing up or closes.
final class ConnectionQuota: Sendable {
    /// What a uid holds.
    private struct Holdings {
        var connections = 0
        var requests = 0
        var subscriptions = 0
    }

    /// The kinds of per-uid holding.
    enum Kind {
        case request, subscription
    }

    private struct State {
        var byUID: [UInt32: Holdings] = [:]
        var connections = 0
    }

    let limits: ConnectionLimits
    private let state = Mutex(State())
    private let budgetUsed = Atomic<Int>(0)

    init(limits: ConnectionLimits) { self.limits = limits }

    /// Admits one more connection of `uid`, or says which limit it is over.
    func reserveConnection(uid: UInt32) -> String? {
        state.withLock { state in
            if state.connections >= limits.connections {
                return "the broker holds its maximum of \(limits.connections) connections"
            }
            if state.byUID[uid, default: Holdings()].connections >= limits.connectionsPerUID {
                return "uid \(uid) holds its maximum of \(limits.connectionsPerUID) connections"
            }
            state.connections += 1
            state.byUID[uid, default: Holdings()].connections += 1
            return nil
        }
    }

    /// Gives back a connection and everything it still held.
    func releaseConnection(uid: UInt32, requests: Int, subscriptions: Int, budgetBytes: Int) {
        state.withLock { state in
            state.connections -= 1
            var holdings = state.byUID[uid, default: Holdings()]
            holdings.connections -= 1
            holdings.requests -= requests
            holdings.subscriptions -= subscriptions
            state.byUID[uid] = holdings.connections == 0 ? nil : holdings
        }
        giveBack(bytes: budgetBytes)
    }

    /// Takes one request or subscription for `uid` if its limit allows.
    func reserve(_ kind: Kind, uid: UInt32) -> Bool {
        let limit = kind == .request ? limits.requestsPerUID : limits.subscriptionsPerUID
        let count: WritableKeyPath<Holdings, Int> = kind == .request ? \.requests : \.subscriptions
        return state.withLock { state in
            guard state.byUID[uid, default: Holdings()][keyPath: count] < limit else { return false }
            state.byUID[uid, default: Holdings()][keyPath: count] += 1
            return true
        }
    }

    /// Gives back one request of `uid` (subscriptions end only with their connection).
    func releaseRequest(uid: UInt32) {
        state.withLock { $0.byUID[uid]?.requests -= 1 }
    }

    /// Draws `bytes` more from the shared budget for held received bytes; false, and nothing
    /// drawn, if that would overdraw it.
    func draw(bytes: Int) -> Bool {
        let used = budgetUsed.add(bytes, ordering: .relaxed).newValue
        guard used > limits.partialLineBudget else { return true }
        budgetUsed.subtract(bytes, ordering: .relaxed)
        return false
    }

    /// Returns `bytes` drawn earlier to the shared budget.
    func giveBack(bytes: Int) {
        if bytes > 0 { budgetUsed.subtract(bytes, ordering: .relaxed) }
    }
}
