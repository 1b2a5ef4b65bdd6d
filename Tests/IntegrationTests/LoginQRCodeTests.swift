import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The device flow's QR code on a terminal (tmux): drawn with half blocks, it decodes (zbarimg,
/// as a phone's camera would) to the link that fills the code in; `--no-qr`, `--json` and a
/// standard output that is not a terminal leave it out.
@Suite struct LoginQRCodeTests {
    static let halfBlocks: Set<Character> = [" ", "\u{2580}", "\u{2584}", "\u{2588}"]

    /// The lines of the QR code on `screen`: the first run of lines of half blocks only.
    static func drawing(on screen: [String]) -> [String] {
        let drawn = { (line: String) in line.contains { $0 != " " } && line.allSatisfy { halfBlocks.contains($0) } }
        guard let first = screen.firstIndex(where: drawn) else { return [] }
        return Array(screen[first...].prefix(while: drawn))
    }

    /// `lines` as a plain PBM image: two modules a character (upper and lower half), each
    /// `scale` pixels square, in a light margin of 4 modules.
    static func image(of lines: [String], scale: Int = 4) -> String {
        let width = lines.map(\.count).max() ?? 0
        var modules: [[Bool]] = []
        for line in lines {
            let cells = Array(line) + Array(repeating: " ", count: width - line.count)
            modules.append(cells.map { $0 == "\u{2588}" || $0 == "\u{2580}" })
            modules.append(cells.map { $0 == "\u{2588}" || $0 == "\u{2584}" })
        }
        let light = [Bool](repeating: false, count: width + 8)
        let framed =
            Array(repeating: light, count: 4)
            + modules.map { [false, false, false, false] + $0 + [false, false, false, false] }
            + Array(repeating: light, count: 4)
        let rows = framed.flatMap { row in
            let pixels = row.flatMap { Array(repeating: $0 ? "1" : "0", count: scale) }.joined(separator: " ")
            return Array(repeating: pixels, count: scale)
        }
        return "P1\n\((width + 8) * scale) \(framed.count * scale)\n" + rows.joined(separator: "\n") + "\n"
    }

    /// What zbarimg reads in the QR code `lines` draw.
    static func decode(_ lines: [String]) throws -> String {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        try image(of: lines).write(toFile: directory.file("qr.pbm"), atomically: true, encoding: .utf8)
        let read = try ChildProcess.capture(
            "/usr/bin/zbarimg", ["--raw", "-q", directory.file("qr.pbm")], environment: [:], stdin: nil)
        #expect(read.status == 0, "\(read.stderr)")
        return read.stdout.trimmingCharacters(in: .newlines)
    }

    /// Runs `brokerctl login qr --flow device EXTRA` on a terminal until its progress line
    /// shows; returns the screen, then cancels it.
    static func screen(of extra: [String], broker: BrokerProcess, idp: OAuth2TestIdP) async throws -> [String] {
        let terminal = try await TmuxTerminal(environment: LoginCommandTests.terminalEnvironment(broker))
        try terminal.run(
            [BrokerProcess.binary("brokerctl").path, "login", "qr", "--flow", "device"]
                + LoginCommandTests.provider(idp) + extra)
        let screen = try await terminal.waitForScreen("the progress line") { lines in
            lines.contains { $0.contains("waiting for you to sign in") || $0.contains(#""event":"device_code""#) }
        }
        try terminal.press("C-c")
        #expect(await eventually { terminal.exitStatus != nil })
        return screen
    }

    @Test func theDeviceLinkIsDrawnAsAQRCodeThatDecodes() async throws {
        try await LoginCommandTests.withBrokerAndIdP { broker, idp in
            let screen = try await Self.screen(of: [], broker: broker, idp: idp)
            let prefix = BackgroundBrokerctl.deviceLinkPrefix
            let link = try #require(screen.first { $0.hasPrefix(prefix) }.map { String($0.dropFirst(prefix.count)) })
            let drawing = Self.drawing(on: screen)
            #expect(drawing.count >= 11, "\(screen.joined(separator: "\n"))")
            #expect(try Self.decode(drawing) == link)
        }
    }

    @Test func noQRJSONAndAPipeDrawNone() async throws {
        try await LoginCommandTests.withBrokerAndIdP { broker, idp in
            for extra in [["--no-qr"], ["--json"]] {
                let screen = try await Self.screen(of: extra, broker: broker, idp: idp)
                #expect(Self.drawing(on: screen).isEmpty, "\(extra): \(screen.joined(separator: "\n"))")
            }
            let piped = try BackgroundBrokerctl(
                broker, ["login", "qr", "--flow", "device"] + LoginCommandTests.provider(idp))
            _ = try await piped.deviceLink()
            #expect(!piped.stderr.contains("\u{2588}") && !piped.stdout.contains("\u{2588}"))
            kill(piped.child.pid, SIGINT)
            #expect(await piped.finish() == 130)
        }
    }
}
