import Foundation
import TestSupport
import Testing

/// The exit codes docs/commands.md and brokerctl(1) list are the ones brokerctl's code has:
/// `brokerctl --help` prints its list (`ExitStatus`), and the three must say the same.
@Suite struct ExitCodeTableTests {
    typealias Row = (code: String, meaning: String)

    static let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    /// The rows of the table under "| exit code | meaning |" in docs/commands.md.
    static func documented() throws -> [Row] {
        let text = try String(
            contentsOf: repository.appendingPathComponent("docs/commands.md"), encoding: .utf8)
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false)
        guard let header = lines.firstIndex(of: "| exit code | meaning |") else { return [] }
        return lines[(header + 2)...].prefix { $0.hasPrefix("|") }.map { line in
            let cells = line.split(separator: "|").map { $0.trimmingCharacters(in: .whitespaces) }
            return (cells[0], cells[1])
        }
    }

    /// The `.TP`/`.B CODE`/meaning entries of brokerctl(1)'s EXIT STATUS, unescaped.
    static func manual() throws -> [Row] {
        let text = try String(
            contentsOf: repository.appendingPathComponent("man/man1/brokerctl.1"), encoding: .utf8)
        let start = try #require(text.range(of: ".SH EXIT STATUS\n")).upperBound
        let end = text[start...].range(of: "\n.SH ")?.lowerBound ?? text.endIndex
        let lines = text[start..<end].split(separator: "\n").map { String($0).replacing(#"\-"#, with: "-") }
        var rows: [Row] = []
        var index = 0
        while index + 2 < lines.count, lines[index] == ".TP", lines[index + 1].hasPrefix(".B ") {
            rows.append((String(lines[index + 1].dropFirst(3)), lines[index + 2]))
            index += 3
        }
        #expect(index == lines.count, "brokerctl(1)'s EXIT STATUS holds only .TP entries: \(lines[index...])")
        return rows
    }

    /// `text` with every run of white space made one space, as wrapping may break lines anywhere.
    static func flattened(_ text: some StringProtocol) -> String {
        text.split(whereSeparator: \.isWhitespace).joined(separator: " ")
    }

    @Test func docsManualAndHelpListTheSameCodes() throws {
        let documented = try Self.documented()
        #expect(documented.count >= 15, "\(documented)")
        #expect(Set(documented.map(\.code)).count == documented.count, "a code listed twice")
        let manual = try Self.manual()
        #expect(manual.map(\.code) == documented.map(\.code))
        #expect(manual.map(\.meaning) == documented.map(\.meaning))

        let (status, help) = try ChildProcess.run(BrokerProcess.binary("brokerctl").path, ["--help"], environment: [:])
        #expect(status == 0)
        let listed = help.split(separator: "Exit codes:").last?.split(separator: "\n\n").first ?? ""
        #expect(
            Self.flattened(listed) == documented.map { "\($0.code) \($0.meaning)" }.joined(separator: " "),
            "brokerctl --help: \(listed)")
    }
}
