import CIdleMemory
import FoundationEssentials
import Testing

/// `tokenbroker_release_idle_memory`, run on this test process: its pages of code and read-only
/// data go, and everything it relocated or wrote stays.
@Suite struct IdleMemoryTests {
    /// Resident file-backed memory of this process in KiB (`RssFile` in /proc/self/status).
    private func residentFileKiB() throws -> Int {
        let status = try String(contentsOfFile: "/proc/self/status", encoding: .utf8)
        let line = try #require(status.split(separator: "\n").first { $0.hasPrefix("RssFile:") })
        return try #require(Int(line.split(separator: " ", omittingEmptySubsequences: true)[1]))
    }

    @Test func unmapsCodeAndReadOnlyDataAndTheProcessRunsOn() throws {
        let before = try residentFileKiB()
        let released = tokenbroker_release_idle_memory()
        let after = try residentFileKiB()
        // The test binary alone has megabytes of code and read-only data.
        #expect(released > 1 << 20)
        #expect(after < before - 512, "RssFile went from \(before) to \(after) KiB")
        // Relocated data (protocol witnesses, metadata, the GOT) still holds: generic, dynamic and
        // library code all run, and their results are right.
        let words = (0..<1000).map { "word-\($0)" }
        let counted = Dictionary(grouping: words, by: \.count).mapValues(\.count)
        #expect(counted == [6: 10, 7: 90, 8: 900])
        let encoded = try JSONEncoder().encode(["after": released > 0])
        #expect(String(decoding: encoded, as: UTF8.self) == #"{"after":true}"#)
        // Again: what ran since is released again (other suites, running alongside, may have
        // loaded a library meanwhile), and nothing breaks a second time.
        #expect(tokenbroker_release_idle_memory() >= released)
    }
}
