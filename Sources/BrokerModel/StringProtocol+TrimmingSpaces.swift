extension StringProtocol {
    /// The text without the spaces and tabs (Unicode `Zs` and U+0009) at either end, as
    /// Foundation's `trimmingCharacters(in: .whitespaces)` gave it.
    package func trimmingSpaces() -> String {
        let isSpace: (Unicode.Scalar) -> Bool = { $0 == "\t" || $0.properties.generalCategory == .spaceSeparator }
        let scalars = Substring(self).unicodeScalars
        guard let first = scalars.firstIndex(where: { !isSpace($0) }),
            let last = scalars.lastIndex(where: { !isSpace($0) })
        else { return "" }
        return String(String.UnicodeScalarView(scalars[first...last]))
    }
}
