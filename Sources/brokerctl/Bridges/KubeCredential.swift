import ArgumentParser
import BrokerClient
import BrokerProtocol
import FoundationEssentials

#if canImport(Glibc)
import Glibc
#endif

/// `brokerctl kube-credential ACCOUNT`: a kubectl exec credential plugin
/// (client.authentication.k8s.io): prints an `ExecCredential` with the account's token.
struct KubeCredential: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "kube-credential",
        abstract: "kubectl's exec credential plugin: prints an ExecCredential with the account's token.",
        discussion: """
            The apiVersion is the one kubectl asks in KUBERNETES_EXEC_INFO (client.authentication.k8s.io/v1
            or v1beta1; v1 when it asks none). Use interactiveMode: Never in the kubeconfig. With
            provideClusterInfo: true, a cluster served over plain http (other than on this machine)
            gets no token.
            """)

    /// The API group of exec credentials.
    static let group = "client.authentication.k8s.io"
    /// The versions answered, first the default.
    static let versions = ["v1", "v1beta1"]
    /// Longest `KUBERNETES_EXEC_INFO` read (it may carry the cluster's CA certificates).
    static let maximumInfoSize = 1 << 20

    @OptionGroup var options: BridgeOptions
    @OptionGroup var narrowing: Narrowing
    @Argument(help: "Account name.", completion: AccountNames.completion) var account: String

    func run() throws {
        let info = getenv("KUBERNETES_EXEC_INFO").map { String(cString: $0) }
        let apiVersion = try Self.requestedVersion(info)
        try Self.refusePlainHTTP(info)
        let token = try GlobalOptions.reportingFailures { try options.token(of: account, narrowing: narrowing) }
        let credential = ExecCredential(
            apiVersion: apiVersion,
            status: .init(token: token.accessToken, expirationTimestamp: Wire.rfc3339(token.expiresAt)))
        StandardStream.output.write(String(decoding: try Wire.makeEncoder().encode(credential), as: UTF8.self) + "\n")
    }

    /// The `apiVersion` to answer with: the one `info` (KUBERNETES_EXEC_INFO) asks for, v1
    /// without it; an error for a version this plugin does not speak.
    static func requestedVersion(_ info: String?) throws -> String {
        guard let info, !info.isEmpty else { return "\(group)/\(versions[0])" }
        guard info.utf8.count <= maximumInfoSize,
            let asked = try? JSONDecoder().decode(ExecInfo.self, from: Data(info.utf8))
        else {
            throw BridgeFailure("KUBERNETES_EXEC_INFO is not an ExecCredential object")
        }
        guard let version = asked.apiVersion, versions.contains(where: { "\(group)/\($0)" == version }) else {
            throw BridgeFailure(
                "KUBERNETES_EXEC_INFO asks for apiVersion \(asked.apiVersion ?? "(none)"); this plugin answers "
                    + versions.map { "\(group)/\($0)" }.joined(separator: " or "))
        }
        return version
    }

    /// Refuses a bearer token for a cluster whose server (given with `provideClusterInfo`) is
    /// plain http to another machine, where anyone on the path would read it.
    static func refusePlainHTTP(_ info: String?) throws {
        guard let info, info.utf8.count <= maximumInfoSize,
            let server = (try? JSONDecoder().decode(ExecInfo.self, from: Data(info.utf8)))?.spec?.cluster?.server,
            let url = URL(string: server), url.scheme?.lowercased() == "http"
        else { return }
        guard let host = url.host, LoopbackHost.contains(host) else {
            throw BridgeFailure(
                "not sending a bearer token to the plain-http cluster server "
                    + JSONText.quote(String(server.prefix(200))) + "; use https")
        }
    }

    /// What kubectl sends in KUBERNETES_EXEC_INFO, as far as it is read here.
    struct ExecInfo: Decodable {
        var apiVersion: String?
        var spec: Spec?

        struct Spec: Decodable {
            var cluster: Cluster?
        }

        struct Cluster: Decodable {
            var server: String?
        }
    }
}

/// The object an exec credential plugin prints.
struct ExecCredential: Encodable {
    var kind = "ExecCredential"
    var apiVersion: String
    var status: Status

    struct Status: Encodable {
        var token: String
        /// RFC 3339, UTC.
        var expirationTimestamp: String
    }
}
