/// The "did you mean" of a mistyped command or account name: the candidate fewest edits away
/// (insertions, deletions, substitutions and swaps of neighbours), when it is close enough to be a
/// typo rather than another word.
enum Suggestion {
    /// Longest name compared (names are short; a long argument is no typo of one).
    static let maximumLength = 128

    /// The nearest of `candidates` to `text`, within a third of its length (at least one edit).
    static func nearest(to text: String, among candidates: [String]) -> String? {
        let typed = Array(text.unicodeScalars)
        guard !typed.isEmpty, typed.count <= maximumLength else { return nil }
        let allowed = max(1, typed.count / 3)
        let scored = candidates.compactMap { candidate -> (String, Int)? in
            let other = Array(candidate.unicodeScalars)
            guard other.count <= maximumLength, candidate != text else { return nil }
            let distance = edits(typed, other)
            return distance <= allowed ? (candidate, distance) : nil
        }
        return scored.min { $0.1 < $1.1 || ($0.1 == $1.1 && $0.0 < $1.0) }?.0
    }

    /// The optimal string alignment distance between `a` and `b`.
    static func edits(_ a: [Unicode.Scalar], _ b: [Unicode.Scalar]) -> Int {
        guard !a.isEmpty else { return b.count }
        guard !b.isEmpty else { return a.count }
        var table = [[Int]](repeating: [Int](repeating: 0, count: b.count + 1), count: a.count + 1)
        for i in 0...a.count { table[i][0] = i }
        for j in 0...b.count { table[0][j] = j }
        for i in 1...a.count {
            for j in 1...b.count {
                let cost = a[i - 1] == b[j - 1] ? 0 : 1
                var best = min(table[i - 1][j] + 1, table[i][j - 1] + 1, table[i - 1][j - 1] + cost)
                if i > 1, j > 1, a[i - 1] == b[j - 2], a[i - 2] == b[j - 1] {
                    best = min(best, table[i - 2][j - 2] + 1)
                }
                table[i][j] = best
            }
        }
        return table[a.count][b.count]
    }
}
