import ArgumentParser
import BrokerClient
import BrokerProtocol
import FoundationEssentials

#if canImport(Glibc)
import Glibc
#endif

/// What every bridge (`git-credential`, `docker-credential`, `kube-credential`, `exec`,
/// `header`) shares: the broker it asks, how long its token must live, and the accounts that
/// serve a git host or a registry, found through `status` (brokerctl never reads broker.toml:
/// it may run where that file is not, e.g. in a container that has only the socket).
struct BridgeOptions: ParsableArguments {
    @Option(help: "Socket path (default: $TOKENBROKER_SOCKET or $XDG_RUNTIME_DIR/tokenbroker/broker.sock).")
    var socket: String?

    @Option(help: "Seconds the token must stay valid (default: the broker's default_min_ttl).")
    var minTTL: Double?

    @Option(help: "Seconds to wait for the broker's answer (it may be refreshing at the IdP).")
    var timeout: Double = 120

    func validate() throws {
        if let minTTL, !(minTTL.isFinite && (0...Bounds.maximumLifetime).contains(minTTL)) {
            throw ValidationError("--min-ttl must be a number of seconds from 0 to \(Int(Bounds.maximumLifetime))")
        }
    }

    /// A client of the broker these options name.
    func client() throws -> BlockingBrokerClient {
        try GlobalOptions.client(socket: socket, timeout: timeout)
    }

    /// The bearer token of `account`, valid for `--min-ttl` seconds (narrowed as `narrowing`
    /// says). A DPoP-bound token is refused: a tool that sends only `Authorization` would be
    /// refused by the resource server, with a less clear error. (A `Narrowing` only exists
    /// parsed: reading an unparsed option group traps.)
    func token(of account: String, narrowing: Narrowing? = nil) throws -> TokenResult {
        let token = try self.token(of: account, narrowing: narrowing, dpop: nil)
        guard !TokenType.isDPoP(token.tokenType) else { throw BridgeFailure.dpopBound(account) }
        return token
    }

    /// The token of `account`, with a proof for `dpop` when given.
    func token(of account: String, narrowing: Narrowing?, dpop: DPoPRequest?) throws -> TokenResult {
        try client().perform(
            .token(
                account: account, minTTL: minTTL, scope: narrowing?.scope, resource: narrowing?.resource, dpop: dpop))
    }

    /// The accounts the caller may use, with their bridge settings.
    func accounts() throws -> [AccountStatus] {
        try client().perform(.status()).accounts
    }
}

/// `--scope` and `--resource`: a token cut down to some scopes or one audience (oauth2 accounts).
struct Narrowing: ParsableArguments {
    @Option(help: "Scopes to narrow the token to, space-separated (oauth2 accounts; exit 7 when the IdP refuses).")
    var scope: String?
    @Option(help: "Absolute URI of the resource the token is for (RFC 8707; oauth2 accounts).")
    var resource: String?
}

/// What stopped a bridge: printed as `Error: description` with no usage text (the command line
/// was right); docker's helper writes it to stdout, where docker reads it.
struct BridgeFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }

    /// A bridge asked for the token of an account whose tokens are DPoP-bound.
    static func dpopBound(_ account: String) -> BridgeFailure {
        BridgeFailure(
            "the account \(account)'s tokens are DPoP-bound (RFC 9449): each request needs a proof, which this tool "
                + "cannot send; use brokerctl header \(account) --method METHOD --url URL, or a client's dpop_headers")
    }
}

/// A descriptor (standard input by default) read to its end with bounds: a helper's input
/// comes from another program.
enum BoundedInput {
    /// Why the input was not read whole.
    enum Failure: Error {
        case tooLarge
        case unreadable
    }

    /// Everything readable at `fd`, at most `limit` bytes.
    static func read(_ fd: Int32 = STDIN_FILENO, limit: Int) throws(Failure) -> [UInt8] {
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 16384)
        while true {
            let count = Glibc.read(fd, &chunk, chunk.count)
            if count < 0, errno == EINTR { continue }
            guard count >= 0 else { throw .unreadable }
            guard count > 0 else { return bytes }
            bytes.append(contentsOf: chunk[..<count])
            if bytes.count > limit { throw .tooLarge }
        }
    }

    /// Everything on standard input; `nil` when it is larger than `limit` or cannot be read.
    static func read(limit: Int) -> [UInt8]? { try? read(STDIN_FILENO, limit: limit) }
}

extension String {
    /// The text after the last `/`: a program's name as it was invoked.
    var baseName: String {
        guard let slash = lastIndex(of: "/") else { return self }
        return String(self[index(after: slash)...])
    }
}
