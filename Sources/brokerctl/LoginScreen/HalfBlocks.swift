/// A QR code drawn on a terminal with Unicode half blocks, two rows of modules per line: black
/// on white whatever the terminal's colours, in a light quiet zone of 2 modules, which phone
/// cameras read.
enum HalfBlocks {
    /// Light modules around the code.
    static let quietZone = 2

    /// The lines for `rows` (of `1` dark and `0` light, as many as each is long); `nil` for
    /// anything else.
    static func drawing(of rows: [String]) -> String? {
        let modules = rows.map { row in row.utf8.map { $0 == UInt8(ascii: "1") } }
        guard !modules.isEmpty,
            rows.allSatisfy({ $0.utf8.count == rows.count && $0.utf8.allSatisfy { "01".utf8.contains($0) } })
        else { return nil }
        let side = rows.count + 2 * quietZone
        let dark = { (row: Int, column: Int) in
            modules.indices.contains(row - quietZone) && modules.indices.contains(column - quietZone)
                && modules[row - quietZone][column - quietZone]
        }
        return stride(from: 0, to: side, by: 2).map { row in
            let cells = (0..<side).map { column -> Character in
                switch (dark(row, column), dark(row + 1, column)) {
                case (true, true): "\u{2588}"
                case (true, false): "\u{2580}"
                case (false, true): "\u{2584}"
                case (false, false): " "
                }
            }
            // Black on white, reset before the line ends.
            return "\u{1B}[30;47m" + String(cells) + "\u{1B}[0m\n"
        }.joined()
    }
}
