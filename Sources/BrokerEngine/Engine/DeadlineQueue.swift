import BrokerIdP
import BrokerModel
import BrokerSecrets
import BrokerVault
import FoundationEssentials

/// Keys each due at a date, as a binary min-heap that knows each key's place in it: the earliest
/// date is read at once, and a key's date is set, moved or removed in O(log n), so the
/// scheduler finds its next deadline without a walk over every account.
package struct DeadlineQueue<Key: Hashable & Sendable>: Sendable {
    private var heap: [(key: Key, at: Date)] = []
    private var places: [Key: Int] = [:]

    /// The earliest date queued, if any.
    package var earliest: Date? { heap.first?.at }

    /// When `key` is due; `nil` (set or read) when it is not queued.
    package subscript(key: Key) -> Date? {
        get { places[key].map { heap[$0].at } }
        set {
            switch (places[key], newValue) {
            case (nil, nil):
                return
            case (nil, let at?):
                heap.append((key, at))
                places[key] = heap.count - 1
                siftUp(heap.count - 1)
            case (let place?, let at?):
                heap[place].at = at
                restore(place)
            case (let place?, nil):
                remove(at: place)
            }
        }
    }

    /// Every key due at `date` or before, in no particular order; visits only those keys and
    /// their children in the heap.
    package func keys(dueBy date: Date) -> [Key] {
        var due: [Key] = []
        var pending = heap.isEmpty ? [] : [0]
        while let place = pending.popLast() {
            guard heap[place].at <= date else { continue }
            due.append(heap[place].key)
            for child in [2 * place + 1, 2 * place + 2] where child < heap.count { pending.append(child) }
        }
        return due
    }

    private mutating func remove(at place: Int) {
        places[heap[place].key] = nil
        let last = heap.removeLast()
        guard place < heap.count else { return }
        heap[place] = last
        places[last.key] = place
        restore(place)
    }

    /// Moves the entry at `place`, whose date changed, up or down to where it belongs.
    private mutating func restore(_ place: Int) {
        if place > 0, heap[place].at < heap[(place - 1) / 2].at {
            siftUp(place)
        } else {
            siftDown(place)
        }
    }

    private mutating func siftUp(_ start: Int) {
        var place = start
        while place > 0 {
            let parent = (place - 1) / 2
            guard heap[place].at < heap[parent].at else { return }
            swapAt(place, parent)
            place = parent
        }
    }

    private mutating func siftDown(_ start: Int) {
        var place = start
        while true {
            let left = 2 * place + 1
            guard left < heap.count else { return }
            let right = left + 1
            let child = right < heap.count && heap[right].at < heap[left].at ? right : left
            guard heap[child].at < heap[place].at else { return }
            swapAt(place, child)
            place = child
        }
    }

    private mutating func swapAt(_ one: Int, _ other: Int) {
        heap.swapAt(one, other)
        places[heap[one].key] = one
        places[heap[other].key] = other
    }
}
