import BrokerClient
import BrokerProtocol
import Foundation
import Synchronization
import TestSupport
import Testing

/// A live brokerd with one oauth2 account `api` at a test IdP, declared in broker.toml with
/// `extraConfig` after it (its `[accounts.api.git]` and `.docker` tables), and brokerctl run as
/// the bridges run it. Every output brokerctl gives is kept, to check that no refresh token or
/// client secret ever appears in one.
final class BridgeBroker: Sendable {
    let broker: BrokerProcess
    let idp: OAuth2TestIdP
    /// The refresh token the broker was given.
    let initialRefreshToken: String
    private let outputs = Mutex<[String]>([])

    /// Starts the IdP (tokens living `lifetime` seconds) and the broker, and pushes the refresh
    /// token, with `accessToken` (living an hour) when given: the broker then refreshes nothing
    /// before it is asked to.
    static func start(lifetime: Int = 3600, accessToken: String? = nil, extraConfig: (OAuth2TestIdP) -> String)
        async throws -> BridgeBroker
    {
        let refreshToken = "rt-bridge-\(UInt32.random(in: 0...UInt32.max))"
        let idp = try await OAuth2TestIdP(initialRefreshToken: refreshToken, lifetime: lifetime)
        let broker = try BrokerProcess()
        try broker.writeConfig(
            """
            [accounts.api]
            kind = "oauth2"
            token_endpoint = "\(idp.tokenEndpoint)"
            client_id = "\(idp.clientID)"

            \(extraConfig(idp))
            """)
        try await broker.start()
        let access = accessToken.map { #""access_token":"\#($0)","expires_in":3600,"# } ?? ""
        let pushed = try await broker.brokerctl(
            ["set-tokens", "api"], stdin: #"{\#(access)"refresh_token":"\#(refreshToken)"}"#)
        guard pushed.status == 0 else { throw HarnessError("set-tokens failed: \(pushed.stderr)") }
        return BridgeBroker(broker: broker, idp: idp, initialRefreshToken: refreshToken)
    }

    private init(broker: BrokerProcess, idp: OAuth2TestIdP, initialRefreshToken: String) {
        self.broker = broker
        self.idp = idp
        self.initialRefreshToken = initialRefreshToken
    }

    func stop() async {
        broker.stop()
        await idp.shutdown()
    }

    /// The environment brokerctl and the tools run with: the broker's private home, its
    /// socket in TOKENBROKER_SOCKET, and `extra`.
    func environment(_ extra: [String: String] = [:]) -> [String: String] {
        broker.environment.merging(["TOKENBROKER_SOCKET": broker.socketPath]) { $1 }.merging(extra) { $1 }
    }

    /// Runs `program` (brokerctl by default; a path, or a name found on PATH by `env`) and
    /// keeps its output. It waits on a thread of its own: the test process's two cooperative
    /// threads also run the other suites' in-process brokers.
    func run(
        _ arguments: [String], program: String = BrokerProcess.binary("brokerctl").path, stdin: String? = nil,
        environment extra: [String: String] = [:]
    ) async throws -> (status: Int32, stdout: String, stderr: String) {
        let environment = environment(extra)
        let result = try await onOwnThread {
            try ChildProcess.capture("/usr/bin/env", [program] + arguments, environment: environment, stdin: stdin)
        }
        outputs.withLock { $0 += [result.stdout, result.stderr] }
        return result
    }

    /// A directory holding `name` as a symlink to brokerctl, as scripts/link-helpers makes them.
    func helperDirectory(named names: [String]) throws -> String {
        let directory = broker.root.appendingPathComponent("bin").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        for name in names {
            try FileManager.default.createSymbolicLink(
                atPath: directory + "/" + name, withDestinationPath: BrokerProcess.binary("brokerctl").path)
        }
        return directory
    }

    /// Every output kept so far, and the broker's log, hold no refresh token and no client secret.
    func expectNoSecretInOutputs(sourceLocation: SourceLocation = #_sourceLocation) {
        let texts = outputs.withLock { $0 } + [broker.log]
        let secrets = [initialRefreshToken, idp.clientSecret] + idp.issuedRefreshTokens
        // Checked outside #expect, whose failure message would print the secrets.
        let leaked = secrets.contains { secret in texts.contains { $0.contains(secret) } }
        #expect(!leaked, "a secret appeared in an output", sourceLocation: sourceLocation)
    }

    /// The access token the IdP issued last (the one the broker serves after a refresh).
    var lastIssued: String? { idp.issuedAccessTokens.last }

    /// Whether `token` was issued by the IdP and had not expired at `date` (by the IdP's clock:
    /// issued when it received the refresh, living the IdP's lifetime).
    func wasValid(_ token: String, at date: Date, lifetime: TimeInterval) -> Bool {
        // Every refresh in these tests succeeds: the n-th issued token answered the n-th refresh.
        let refreshes = idp.refreshCalls
        guard let index = idp.issuedAccessTokens.firstIndex(of: token), index < refreshes.count else { return false }
        let issuedAt = refreshes[index].at
        return date >= issuedAt && date < issuedAt.addingTimeInterval(lifetime)
    }
}

/// A bare repository `repo.git` under `work/srv` holding one commit with a README that says
/// `content`, ready for `GitHTTPServer` (dumb HTTP); returns the directory to serve.
func servedRepository(in work: TemporaryDirectory, content: String) throws -> String {
    let repositories = work.file("srv")
    try FileManager.default.createDirectory(atPath: repositories, withIntermediateDirectories: true)
    let plain = ["GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "HOME": work.path]
    let environment = ProcessInfo.processInfo.environment.merging(plain) { $1 }
    try content.write(toFile: work.path + "/README", atomically: true, encoding: .utf8)
    for command in [
        ["git", "init", "-q", "--bare", repositories + "/repo.git"],
        ["git", "init", "-q", work.path + "/src"],
        ["mv", work.path + "/README", work.path + "/src/README"],
        ["git", "-C", work.path + "/src", "add", "README"],
        ["git", "-C", work.path + "/src", "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "one"],
        ["git", "-C", work.path + "/src", "push", "-q", repositories + "/repo.git", "HEAD:refs/heads/main"],
        ["git", "-C", repositories + "/repo.git", "symbolic-ref", "HEAD", "refs/heads/main"],
        ["git", "-C", repositories + "/repo.git", "update-server-info"],
    ] {
        let result = try ChildProcess.run("/usr/bin/env", command, environment: environment)
        guard result.status == 0 else { throw HarnessError("\(command): \(result.output)") }
    }
    return repositories
}
