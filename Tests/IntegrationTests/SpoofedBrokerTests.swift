import BrokerClient
import BrokerProtocol
import FoundationEssentials
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// A spoofed broker (docs/security.md, "Files and the vault at rest"). The client refuses a socket
/// that another user serves before it sends a byte; brokerd refuses a socket directory that another
/// user could change.
@Suite struct SpoofedBrokerTests {
    static let otherUID: uid_t = 65534
    static let canActAsAnotherUser =
        getuid() == 0 && FileManager.default.isExecutableFile(atPath: "/usr/bin/setpriv")
        && FileManager.default.isExecutableFile(atPath: "/usr/bin/python3")

    // MARK: The client end

    @Test(.enabled(if: canActAsAnotherUser)) func theClientLibraryRefusesASocketServedByAnotherUser() async throws {
        let impostor = try Impostor()
        defer { impostor.stop() }

        let error = await #expect(throws: ConnectionError.self) {
            let client = try BrokerClient(socketPath: impostor.socketPath)
            defer { client.close() }
            _ = try await client.add(
                account: "stolen", provider: ProviderSpec(kind: "static"),
                tokens: TokenSet(accessToken: "at-must-not-leak", expiresIn: 3600))
        }
        #expect(error?.description.contains("served by uid \(Self.otherUID)") == true, "\(String(describing: error))")
        #expect(await impostor.connectionsSeen() == ["0"], "the impostor received nothing")
    }

    @Test(.enabled(if: canActAsAnotherUser)) func brokerctlSendsNoSecretToASocketServedByAnotherUser() async throws {
        let impostor = try Impostor()
        defer { impostor.stop() }
        var environment = ProcessInfo.processInfo.environment
        environment["TOKENBROKER_SOCKET"] = impostor.socketPath

        let result = try await ChildProcess.run(
            BrokerProcess.binary("brokerctl").path,
            [
                "add", "stolen", "--kind", "oauth2", "--token-endpoint", "https://idp.example/token",
                "--client-id", "c", "--secrets", "-",
            ],
            environment: environment,
            stdin: #"{"refresh_token":"rt-must-not-leak","client_secret":"cs-must-not-leak"}"#)

        #expect(result.status != 0)
        #expect(result.output.contains("served by uid \(Self.otherUID)"), "\(result.output)")
        #expect(!result.output.contains("must-not-leak"))
        #expect(await impostor.connectionsSeen() == ["0"], "the impostor received nothing")
    }

    // MARK: The server end

    /// Ways another user could have prepared the socket's directory (`$XDG_RUNTIME_DIR/tokenbroker`)
    /// or the directory above it, and what brokerd says when it refuses.
    enum PlantedDirectory: CaseIterable, CustomTestStringConvertible, Sendable {
        case ownedByAnotherUser, groupWritable, worldWritable, symbolicLink, parentWritableByOthers,
            parentOwnedByAnotherUser

        var testDescription: String { "\(self)" }

        /// Sets the trap up in `broker`'s directories.
        func plant(in broker: BrokerProcess) throws {
            let runtime = broker.root.appendingPathComponent("run").path
            let directory = runtime + "/tokenbroker"
            switch self {
            case .ownedByAnotherUser:
                try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: false)
                chmod(directory, 0o700)
                chown(directory, SpoofedBrokerTests.otherUID, gid_t(SpoofedBrokerTests.otherUID))
            case .groupWritable, .worldWritable:
                try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: false)
                chmod(directory, self == .groupWritable ? 0o770 : 0o777)
            case .symbolicLink:
                let elsewhere = broker.root.appendingPathComponent("elsewhere").path
                try FileManager.default.createDirectory(atPath: elsewhere, withIntermediateDirectories: false)
                chmod(elsewhere, 0o700)
                try FileManager.default.createSymbolicLink(atPath: directory, withDestinationPath: elsewhere)
            case .parentWritableByOthers:
                chmod(runtime, 0o777)
            case .parentOwnedByAnotherUser:
                chown(runtime, SpoofedBrokerTests.otherUID, gid_t(SpoofedBrokerTests.otherUID))
            }
        }

        /// What brokerd's refusal says.
        var refusal: String {
            switch self {
            case .ownedByAnotherUser: "belongs to uid \(SpoofedBrokerTests.otherUID)"
            case .groupWritable: "is writable by group or others (mode 0770)"
            case .worldWritable: "is writable by group or others (mode 0777)"
            case .symbolicLink: "is a symbolic link"
            case .parentWritableByOthers: "above it is writable by group or others (mode 0777)"
            case .parentOwnedByAnotherUser: "above it belongs to uid \(SpoofedBrokerTests.otherUID)"
            }
        }
    }

    @Test(.enabled(if: getuid() == 0), arguments: PlantedDirectory.allCases)
    func brokerdRefusesASocketDirectoryAnotherUserCouldChange(planted: PlantedDirectory) async throws {
        let broker = try BrokerProcess()
        try planted.plant(in: broker)
        let directory = URL(fileURLWithPath: broker.socketPath).deletingLastPathComponent().path
        let modeBefore = Self.mode(of: directory)

        #expect(try await broker.runExpectingExit() != 0)
        #expect(broker.log.contains("refusing the socket directory \(directory)"), "\(broker.log)")
        #expect(broker.log.contains(planted.refusal), "\(broker.log)")
        #expect(broker.log.contains("XDG_RUNTIME_DIR"), "the message says what to set")
        #expect(Self.mode(of: directory) == modeBefore, "a directory brokerd did not create is never chmod'ed")
        let elsewhere = broker.root.appendingPathComponent("elsewhere/broker.sock").path
        #expect(!FileManager.default.fileExists(atPath: broker.socketPath) && !Self.exists(elsewhere))
    }

    /// /tmp's shape: root's, world-writable and sticky, so no one can rename what is ours there.
    @Test(.enabled(if: getuid() == 0)) func aRootOwnedStickyDirectoryAboveTheSocketIsAccepted() async throws {
        let broker = try BrokerProcess()
        chmod(broker.root.appendingPathComponent("run").path, 0o1777)
        try await broker.start()
        defer { broker.stop() }
        let client = try broker.client()
        defer { client.close() }
        #expect(try await client.hello().protocol == 1)
        #expect(Self.mode(of: broker.root.appendingPathComponent("run/tokenbroker").path) == 0o700)
    }

    private static func mode(of path: String) -> Int? {
        var info = stat()
        guard lstat(path, &info) == 0 else { return nil }
        return Int(info.st_mode & 0o7777)
    }

    private static func exists(_ path: String) -> Bool {
        var info = stat()
        return lstat(path, &info) == 0
    }
}

/// A program of another user (uid 65534) listening on a Unix socket in a directory of its
/// own, as an impostor would. It answers each line with a failure (so a client that talks to
/// it does not wait forever) and records, per connection, how many bytes it received.
private final class Impostor: @unchecked Sendable {
    let directory: URL
    let socketPath: String
    private let recordPath: String
    private let child: ChildProcess

    private static let script = """
        import json, socket, sys
        path, ready, record = sys.argv[1:4]
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
        server.listen(8)
        open(ready, "w").close()
        while True:
            connection, _ = server.accept()
            connection.settimeout(10)
            received, pending = 0, b""
            try:
                while data := connection.recv(65536):
                    received += len(data)
                    pending += data
                    while b"\\n" in pending:
                        line, pending = pending.split(b"\\n", 1)
                        request = json.loads(line)
                        answer = {"id": request.get("id"), "ok": False, "error": {"code": "internal", "message": "x"}}
                        connection.sendall(json.dumps(answer).encode() + b"\\n")
            except (OSError, ValueError):
                pass
            connection.close()
            with open(record, "a") as file:
                file.write(f"{received}\\n")
        """

    init() throws {
        directory = URL(fileURLWithPath: "/tmp/tb-impostor-\(UInt32.random(in: 0...UInt32.max))")
        socketPath = directory.appendingPathComponent("broker.sock").path
        recordPath = directory.appendingPathComponent("received").path
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: false)
        chown(directory.path, SpoofedBrokerTests.otherUID, gid_t(SpoofedBrokerTests.otherUID))
        let ready = directory.appendingPathComponent("ready").path
        child = try ChildProcess.spawn(
            "/usr/bin/setpriv",
            [
                "--reuid=\(SpoofedBrokerTests.otherUID)", "--regid=\(SpoofedBrokerTests.otherUID)", "--clear-groups",
                "/usr/bin/python3", "-c", Self.script, socketPath, ready, recordPath,
            ],
            environment: ["PATH": "/usr/bin:/bin"])
        let child = self.child
        guard Poll.blocking(timeout: 15, { FileManager.default.fileExists(atPath: ready) || child.hasExited() }),
            !child.hasExited()
        else {
            stop()
            throw HarnessError("the impostor did not start")
        }
    }

    /// The bytes received on each connection that has ended, once at least one has (its line
    /// written whole: the file appears before the impostor writes into it).
    func connectionsSeen() async -> [String] {
        var text = ""
        _ = await eventually(timeout: 10) {
            text = (try? String(contentsOfFile: self.recordPath, encoding: .utf8)) ?? ""
            return text.hasSuffix("\n")
        }
        return text.split(separator: "\n").map(String.init)
    }

    /// Kills the impostor by PID, reaps it and removes its directory.
    func stop() {
        kill(child.pid, SIGKILL)
        child.wait()
        try? FileManager.default.removeItem(at: directory)
    }
}
