@testable import BrokerEngine
@testable import BrokerIdP
@testable import BrokerModel
@testable import BrokerSecrets
@testable import BrokerVault
import FoundationEssentials
import Testing

/// The scheduler's deadlines: the earliest date and the keys due by a date stay those of a
/// plain dictionary through any sequence of dates set, moved and removed.
@Suite struct DeadlineQueueTests {
    let start = Date(timeIntervalSince1970: 1_800_000_000)

    @Test func theEarliestFollowsDatesSetMovedAndRemoved() {
        var queue = DeadlineQueue<String>()
        #expect(queue.earliest == nil)
        queue["a"] = start.addingTimeInterval(30)
        queue["b"] = start.addingTimeInterval(10)
        queue["c"] = start.addingTimeInterval(20)
        #expect(queue.earliest == start.addingTimeInterval(10))
        queue["a"] = start.addingTimeInterval(5)
        #expect(queue.earliest == start.addingTimeInterval(5))
        #expect(queue.keys(dueBy: start.addingTimeInterval(10)).sorted() == ["a", "b"])
        queue["a"] = nil
        queue["b"] = start.addingTimeInterval(40)
        #expect(queue.earliest == start.addingTimeInterval(20))
        #expect(queue["a"] == nil)
        #expect(queue["b"] == start.addingTimeInterval(40))
        #expect(queue.keys(dueBy: .distantFuture).sorted() == ["b", "c"])
        #expect(queue.keys(dueBy: start).isEmpty)
    }

    @Test func randomChangesAgreeWithADictionary() {
        for seed in UInt64(1)...10 {
            var generator = SeededGenerator(seed: seed)
            var queue = DeadlineQueue<Int>()
            var reference: [Int: Date] = [:]
            for step in 0..<1000 {
                let key = Int.random(in: 0..<64, using: &generator)
                // Few distinct dates, so that equal dates are common.
                let date =
                    Int.random(in: 0..<8, using: &generator) == 0
                    ? nil : start.addingTimeInterval(Double(Int.random(in: 0..<100, using: &generator)))
                queue[key] = date
                reference[key] = date
                let probe = start.addingTimeInterval(Double(Int.random(in: -1..<101, using: &generator)))
                #expect(queue.earliest == reference.values.min(), "seed \(seed), step \(step)")
                #expect(
                    queue.keys(dueBy: probe).sorted() == reference.filter { $0.value <= probe }.keys.sorted(),
                    "seed \(seed), step \(step)")
                #expect(queue[key] == reference[key], "seed \(seed), step \(step)")
            }
        }
    }
}
