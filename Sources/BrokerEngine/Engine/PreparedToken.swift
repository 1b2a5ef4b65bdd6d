import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import BrokerVault
import FoundationEssentials
import NIOCore

/// An account's access token with its answer built once, in guarded memory, so serving a
/// cached token costs a dictionary lookup and a few byte copies straight into the outgoing
/// buffer instead of a JSON encode, and no copy of the token outlives the answer.
public struct PreparedToken: Sendable {
    public let account: String
    public let token: AccessToken
    /// `"account":…,"access_token":…,…,"expires_at":"…"` without braces or `expires_in`.
    private let fields: SecretBytes
    /// The account's DPoP key, which signs the proofs asked for beside the token, the token's
    /// `ath`, and the IdP endpoints no proof is made for; `nil` for a bearer account.
    private let dpop: (key: DPoPKey, accessTokenHash: String, idpEndpoints: DPoPIdPEndpoints)?

    /// Fails when no guarded memory can hold the answer.
    public init(account: String, token: AccessToken, dpop: (key: DPoPKey, idpEndpoints: DPoPIdPEndpoints)?)
        throws(BrokerFailure)
    {
        self.account = account
        self.token = token
        self.dpop = dpop.map { ($0.key, DPoPKey.accessTokenHash(token.value), $0.idpEndpoints) }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(256 + account.utf8.count + 2 * (token.value.count + (token.idToken?.count ?? 0)))
        bytes += #""account":"#.utf8
        JSONText.appendQuoted(account.utf8, to: &bytes)
        bytes += #","access_token":"#.utf8
        token.value.withUnsafeBytes { JSONText.appendQuoted($0, to: &bytes) }
        bytes += #","token_type":"#.utf8
        JSONText.appendQuoted(token.type.utf8, to: &bytes)
        bytes += #","expires_at":""#.utf8
        bytes += Wire.rfc3339(token.expiresAt).utf8
        bytes += #"""#.utf8
        if let idToken = token.idToken {
            bytes += #","id_token":"#.utf8
            idToken.withUnsafeBytes { JSONText.appendQuoted($0, to: &bytes) }
        }
        if let scope = token.scope {
            bytes += #","scope":"#.utf8
            JSONText.appendQuoted(scope.utf8, to: &bytes)
        }
        defer { Sodium.wipe(&bytes) }
        let stored = bytes.withUnsafeBytes { bytes in
            Result { () throws(BrokerFailure) in try SecretBytes(bytes: bytes) }
        }
        fields = try stored.get()
    }

    /// When the token expires.
    public var expiresAt: Date { token.expiresAt }

    /// The answer as the wire type, for the slow path and tests: a transient copy of the secrets.
    public var result: TokenResult {
        TokenResult(
            account: account, accessToken: token.value.text, tokenType: token.type, expiresAt: token.expiresAt,
            expiresIn: 0, idToken: token.idToken?.text, scope: token.scope)
    }

    /// Seconds of validity left at `now`, rounded down.
    public func expiresIn(at now: Date) -> Int { Bounds.wholeSeconds(token.expiresAt.timeIntervalSince(now)) }

    /// Bytes a success line takes at most, for sizing the buffer it is written into.
    public var lineCapacity: Int { fields.count + 64 }

    /// Whether the account's tokens are bound to a DPoP key, which can sign proofs for them.
    public var provesPossession: Bool { dpop != nil }

    /// Why no program gets a proof for `target`, on its IdP's origin (`DPoPIdPEndpoints`), or `nil`.
    public func idpRefusal(_ target: DPoPTarget) -> String? { dpop?.idpEndpoints.refusal(for: target.normalized) }

    /// A DPoP proof for `target` with this token's `ath`, signed at `now`; `nil` for a bearer
    /// account or when libcrypto fails. A whole signature (docs/dpop.md, "Signing"): call it
    /// where blocking is allowed.
    public func proof(for target: DPoPTarget, now: Date) -> String? {
        guard let dpop else { return nil }
        return dpop.key.proof(
            method: target.method, url: target.url, now: now, nonce: target.nonce,
            accessTokenHash: dpop.accessTokenHash)
    }

    /// Writes the complete success line for request `id`, newline included, into `buffer`,
    /// with `proof` as `dpop_proof` when given.
    public func write(id: RequestID?, now: Date, proof: String? = nil, into buffer: inout ByteBuffer) {
        buffer.reserveCapacity(minimumWritableBytes: lineCapacity + (proof?.utf8.count ?? 0))
        buffer.writeStaticString(#"{"id":"#)
        buffer.writeString(JSONText.encode(id ?? .null))
        buffer.writeStaticString(#","ok":true,"result":{"#)
        fields.withUnsafeBytes { _ = buffer.writeBytes($0) }
        if let proof {
            // A proof is base64url and dots: nothing in it needs escaping.
            buffer.writeStaticString(#","dpop_proof":""#)
            buffer.writeString(proof)
            buffer.writeStaticString(#"""#)
        }
        buffer.writeStaticString(#","expires_in":"#)
        buffer.writeString(String(expiresIn(at: now)))
        buffer.writeStaticString("}}\n")
    }

    /// The complete success line for request `id`, newline included (the slow path's answer).
    public func line(id: RequestID?, now: Date, proof: String? = nil) -> [UInt8] {
        var buffer = ByteBufferAllocator().buffer(capacity: lineCapacity)
        write(id: id, now: now, proof: proof, into: &buffer)
        return Array(buffer.readableBytesView)
    }
}
