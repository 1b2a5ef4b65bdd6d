import BrokerEngine
import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import BrokerVault
import FoundationEssentials
import Logging
import NIOCore
import NIOPosix

/// Decodes request lines and runs them against the broker; knows nothing about sockets.
public struct RequestDispatcher: Sendable {
    public static let serverName = "tokenbroker/0.1.0"

    let broker: Broker
    /// The broker's operations as the protocol states them.
    let operations: WireOperations
    let policy: AccessPolicy
    /// Gets a debug line for each request that runs on the broker and fails.
    let logger: Logger
    /// `token` requests that missed the cache, and `reject`s, waiting on their event loops for a
    /// refresh.
    let waiters = RefreshWaiters()

    public init(broker: Broker, policy: AccessPolicy, logger: Logger = Logger(label: "brokerd")) {
        self.broker = broker
        self.operations = WireOperations(broker)
        self.policy = policy
        self.logger = logger
    }

    /// What to do with one line: answer it now (`immediate`) or run it on the broker (`deferred`).
    enum Decision {
        case immediate([UInt8])
        /// A cached token, written from guarded memory straight into the outgoing buffer.
        case cached(PreparedToken, id: RequestID?, now: Date)
        /// A cached token with a proof asked for the request `dpop` names: the request checked
        /// and the proof signed (`proof(_:for:now:)`) off the event loop, on `signers`, so that
        /// proofs use every core and the event loop only reads and writes.
        case prove(PreparedToken, dpop: DPoPRequest, id: RequestID?, now: Date)
        /// A plain `token` request that missed the cache, or a plain `reject`: wait on the event
        /// loop with the other requests for the same token (`waiters`) until `fetchToken` has it.
        case awaitToken(RefreshWaiters.Key, id: RequestID?)
        case deferred(Request)
        /// Acknowledge with the first line, then stream the events as lines on the same connection.
        case subscribe(ack: [UInt8], id: RequestID, events: EventHub.Events)
        /// Run a `login` (`runLogin`): progress lines, then its answer; cancelled with the connection.
        case login(Request)
    }

    /// Parses `line` and answers at once whatever needs no waiting: cached tokens (through the
    /// flat-request fast path) and errors.
    ///
    /// The fast path answers only lines that the full path (`JSONLine`, then the decoder) reads
    /// the same way, and holds them to the same checks, so a line gets one answer whichever
    /// path takes it. Both ask `access` whether the caller may use the account first.
    func decide(line: UnsafeRawBufferPointer, access: inout CallerAccess, decoder: JSONDecoder, now: Date) -> Decision {
        let flat = FlatRequest.parse(line)
        if let flat, flat.op == Operation.token.rawValue {
            if let account = try? AccountField.required(flat.account) {
                guard access.mayUse(account) else { return .immediate(forbidden(id: flat.id, account: account)) }
                if let seconds = try? minTTL(flat.minTTL) {
                    if let token = broker.cache.token(for: account, minTTL: seconds, now: now) {
                        guard let dpop = flat.dpop else { return .cached(token, id: flat.id, now: now) }
                        return .prove(token, dpop: dpop, id: flat.id, now: now)
                    }
                    // A cache miss with a `dpop` takes the full path, which checks it first.
                    if !broker.padlock.isLocked, flat.dpop == nil {
                        return .awaitToken(RefreshWaiters.Key(account: account, minTTL: seconds), id: flat.id)
                    }
                }
            }
            if broker.padlock.isLocked { return .immediate(errorLine(id: flat.id, BrokerError(BrokerFailure.locked))) }
            // The scanner read every field a token request has, as the decoder would: no second read.
            var request = Request(id: flat.id, op: Operation.token.rawValue, account: flat.account, minTTL: flat.minTTL)
            request.dpop = flat.dpop
            return .deferred(request)
        }
        // A `reject` the full path would run waits with the others that reject the same token,
        // for one refresh (an error the full path would give, it gives).
        if let flat, flat.op == Operation.reject.rawValue, let rejected = flat.accessToken, !broker.padlock.isLocked,
            let account = try? AccountField.required(flat.account), let seconds = try? minTTL(flat.minTTL)
        {
            guard access.mayUse(account) else { return .immediate(forbidden(id: flat.id, account: account)) }
            return .awaitToken(RefreshWaiters.Key(account: account, minTTL: seconds, rejected: rejected), id: flat.id)
        }
        // A line the scanner read is well-formed JSON with no repeated key.
        if flat == nil, let problem = JSONLine.problem(in: line) {
            return .immediate(refusal(problem, line: line, decoder: decoder))
        }
        let data = Data(line)
        let request: Request
        do {
            request = try decoder.decode(Request.self, from: data)
        } catch {
            let id = (try? decoder.decode(IDOnly.self, from: data))?.id
            return .immediate(errorLine(id: id, BrokerError(.badRequest, "a field has the wrong type")))
        }
        guard let op = request.op else {
            return .immediate(errorLine(id: request.id, BrokerError(.badRequest, "the field \"op\" is required")))
        }
        guard let operation = Operation(rawValue: op) else {
            return .immediate(
                errorLine(
                    id: request.id,
                    BrokerError(.unknownOp, "unknown op \"\(JSONText.quote(op).dropFirst().dropLast())\"")))
        }
        if operation.isOwnerOnly, !access.mayRunOwnerOperation(op) {
            return .immediate(
                errorLine(id: request.id, BrokerError(.forbidden, "\(op) is reserved for the broker's owner")))
        }
        if let refused = refusedAccount(of: request, operation, access: &access) {
            return .immediate(forbidden(id: request.id, account: refused))
        }
        if !operation.runsWhileLocked, broker.padlock.isLocked {
            return .immediate(errorLine(id: request.id, BrokerError(BrokerFailure.locked)))
        }
        if operation == .subscribe {
            let id = request.id ?? .null
            let events = broker.events.subscribe(accounts: request.accounts)
            let ack = SubscribeResult(accounts: request.accounts, buffer: broker.events.bufferLimit)
            let line =
                (try? success(request, ack, Wire.makeEncoder()))
                ?? errorLine(id: request.id, BrokerError(.internal, "the broker could not encode its answer"))
            return .subscribe(ack: line, id: id, events: events)
        }
        return operation == .login ? .login(request) : .deferred(request)
    }

    /// The answer when libcrypto could not sign a proof (out of memory: never expected).
    static let signingFailed = BrokerError(.internal, "the broker could not sign a DPoP proof")

    /// Why no proof for `target` is made beside `token`: an account of bearer tokens
    /// (`bad_request`), or a target on the account's own IdP (`forbidden`: a program has no
    /// business at its endpoints, docs/dpop.md, "No proof for the IdP's doors"); `nil` when one
    /// is made.
    static func proofRefusal(_ token: PreparedToken, _ target: DPoPTarget) -> BrokerError? {
        let name = JSONText.quote(token.account)
        guard token.provesPossession else {
            return BrokerError(
                .badRequest, "the account \(name) has no DPoP key: its tokens are bearer tokens (set dpop = \"ES256\")")
        }
        if let refusal = token.idpRefusal(target) {
            return BrokerError(.forbidden, "no DPoP proof is made for this request of the account \(name): \(refusal)")
        }
        return nil
    }

    /// The threads that check requests for proofs and sign them, one per core, started at the
    /// first proof: a pool of their own, so that no proof waits behind the blocking work of
    /// `NIOThreadPool.singleton` (an exec helper, a key derivation), and neither an event loop
    /// nor a task signs. Idle, they sleep.
    static let signers: NIOThreadPool = {
        let pool = NIOThreadPool(numberOfThreads: System.coreCount)
        pool.start()
        return pool
    }()

    /// The proof of a cached token for the request `dpop` names at `now`, or why none is made
    /// (the request's check, then as `proof(_:for:now:)`). Run on `signers`.
    static func proof(_ token: PreparedToken, for dpop: DPoPRequest, now: Date) -> Result<String, BrokerError> {
        do {
            return proof(token, for: try target(dpop), now: now)
        } catch {
            return .failure(error)
        }
    }

    /// `token`'s proof for `target` at `now` (a whole signature), or why none is made: the
    /// account has no DPoP key, the target is one of its IdP's doors, or libcrypto failed. Run
    /// on `signers`.
    static func proof(_ token: PreparedToken, for target: DPoPTarget, now: Date) -> Result<String, BrokerError> {
        if let refusal = proofRefusal(token, target) { return .failure(refusal) }
        guard let proof = token.proof(for: target, now: now) else { return .failure(signingFailed) }
        return .success(proof)
    }

    /// The checked request of a `dpop` object (`bad_request` naming the field it refuses).
    static func target(_ dpop: DPoPRequest) throws(BrokerError) -> DPoPTarget {
        do {
            return try DPoPTarget(method: dpop.htm, url: dpop.htu, nonce: dpop.nonce)
        } catch {
            throw BrokerError(error)
        }
    }

    /// The first account `request` names that the caller may not use, if any.
    private func refusedAccount(of request: Request, _ operation: Operation, access: inout CallerAccess) -> String? {
        switch operation {
        case .token, .reject, .status:
            guard let account = request.account, !account.isEmpty else { return nil }
            return access.mayUse(account) ? nil : account
        case .subscribe:
            return request.accounts?.first { !access.mayUse($0) }
        case .hello, .add, .setTokens, .remove, .refresh, .logout, .reload, .login, .unlock, .lock, .rekey, .share,
            .unshare, .update, .fleetStatus:
            return nil
        }
    }

    /// The refusal of an account the caller may not use: the same whether it exists or not.
    private func forbidden(id: RequestID?, account: String) -> [UInt8] {
        let name = JSONText.quote(account)
        return errorLine(id: id, BrokerError(.forbidden, "this program may not use the account \(name)"))
    }

    /// The answer to a line that `JSONLine` refused. It echoes the line's id unless the line
    /// has none that is certain (not JSON, or `id` given twice).
    private func refusal(_ problem: JSONLine.Problem, line: UnsafeRawBufferPointer, decoder: JSONDecoder) -> [UInt8] {
        switch problem {
        case .malformed:
            return errorLine(id: nil, BrokerError(.badRequest, "each line must be one JSON object"))
        case .tooDeep:
            return errorLine(
                id: nil, BrokerError(.badRequest, "values nest deeper than \(JSONLine.maximumDepth) levels"))
        case .duplicateKey(let path):
            let id = path == ["id"] ? nil : (try? decoder.decode(IDOnly.self, from: Data(line)))?.id
            let key = JSONText.quote(path.joined(separator: "."))
            return errorLine(id: id, BrokerError(.badRequest, "the key \(key) appears more than once"))
        }
    }

    /// Whether `caller` may see `account` under the rules in force now (for what a connection
    /// lists or streams: `status` of every account, subscription events).
    public func mayShow(_ account: String, to caller: Caller) -> Bool {
        policy.mayUse(account, caller: caller, rules: policy.rules.current)
    }

    /// One event line for a subscription.
    public func eventLine(id: RequestID, _ event: AccountEvent, encoder: JSONEncoder) -> [UInt8] {
        var data = (try? encoder.encode(EventLine(id: id, event: WireTranslation.event(event)))) ?? Data()
        data.append(0x0A)
        return Array(data)
    }

    /// Runs a request that may wait on the broker and returns its response line; `caller`
    /// sees only the accounts it may use.
    public func run(_ request: Request, caller: Caller) async -> [UInt8] {
        let encoder = Wire.makeEncoder()
        do {
            switch Operation(rawValue: request.op ?? "") {
            case .hello:
                if let versions = request.versions, !versions.contains(protocolVersion) {
                    throw BrokerError(.unsupportedVersion, "this broker speaks protocol version \(protocolVersion)")
                }
                let hello = HelloResult(
                    protocol: protocolVersion, server: Self.serverName, ops: Operation.allCases.map(\.rawValue))
                return try success(request, hello, encoder)
            case .token where request.idToken == true:
                if request.scope != nil || request.resource != nil || request.dpop != nil {
                    throw BrokerError(.badRequest, "\"id_token\" takes no \"scope\", \"resource\" or \"dpop\"")
                }
                let idToken = try await operations.idToken(
                    account: try AccountField.required(request.account), minTTL: minTTL(request.minTTL))
                return try success(request, idToken, encoder)
            case .token:
                // The proof's target is checked before any token is fetched or refreshed.
                let target = try request.dpop.map { dpop throws(BrokerError) in try Self.target(dpop) }
                let token = try await operations.token(
                    account: try AccountField.required(request.account), minTTL: minTTL(request.minTTL),
                    scope: request.scope, resource: request.resource, caller: caller.peer.uid)
                let now = broker.clock.now()
                guard let target else { return token.line(id: request.id, now: now) }
                let proof = try await Self.signers.runIfActive { Self.proof(token, for: target, now: now) }
                return token.line(id: request.id, now: now, proof: try proof.get())
            case .reject:
                guard let accessToken = request.accessToken else {
                    throw BrokerError(.badRequest, "the field \"access_token\" is required")
                }
                let token = try await operations.reject(
                    account: try AccountField.required(request.account), accessToken: accessToken,
                    minTTL: minTTL(request.minTTL), scope: request.scope, resource: request.resource,
                    caller: caller.peer.uid)
                return token.line(id: request.id, now: broker.clock.now())
            case .status:
                let accounts = try await operations.status(account: request.account)
                let locked = broker.padlock.isLocked
                // One copy of the rules for the whole list, not one per account.
                let rules = policy.rules.current
                return try success(
                    request,
                    StatusResult(
                        accounts: accounts.filter { policy.mayUse($0.account, caller: caller, rules: rules) },
                        locked: locked ? true : nil,
                        newVault: broker.padlock.newVault ? true : nil,
                        memoryLocked: SecretBytes.allLocked && DPoPKey.signingMemoryLocked ? nil : false),
                    encoder)
            case .add:
                let added = try await operations.add(
                    account: request.account, provider: request.provider, tokens: request.tokens,
                    shared: request.shared ?? false)
                return try success(request, added, encoder)
            case .setTokens:
                return try success(
                    request, try await operations.setTokens(account: request.account, tokens: request.tokens), encoder)
            case .update:
                return try success(
                    request, try await operations.update(account: request.account, changes: request.changes), encoder)
            case .remove:
                return try success(request, try await operations.remove(account: request.account), encoder)
            case .refresh:
                return try success(request, try await operations.refreshNow(account: request.account), encoder)
            case .logout:
                return try success(
                    request, try await operations.logout(account: request.account, force: request.force ?? false),
                    encoder)
            case .reload:
                return try success(request, try await operations.reload(), encoder)
            case .unlock:
                return try success(request, try await operations.unlock(passphrase: request.passphrase), encoder)
            case .lock:
                return try success(request, try await operations.lockVault(), encoder)
            case .rekey:
                return try success(
                    request, try await operations.rekey(to: request.to, passphrase: request.passphrase), encoder)
            case .share:
                return try success(request, try await operations.share(account: request.account), encoder)
            case .unshare:
                return try success(request, try await operations.unshare(account: request.account), encoder)
            case .fleetStatus:
                return try success(request, try await operations.fleetStatus(), encoder)
            case .subscribe, .login, nil:
                throw BrokerError(.unknownOp, "unknown op")
            }
        } catch let error as BrokerError {
            return failed(request, error)
        } catch {
            return failed(request, BrokerError(.internal, "the broker could not encode its answer"))
        }
    }

    /// The token the requests waiting for `key` get: the same call and the same answer as
    /// `run` gives a `token` or `reject` request (its failure noted once for all of them).
    func fetchToken(_ key: RefreshWaiters.Key) async -> RefreshWaiters.Outcome {
        do {
            if let rejected = key.rejected {
                let token = try await operations.reject(account: key.account, accessToken: rejected, minTTL: key.minTTL)
                return .success(token)
            }
            return .success(try await operations.token(account: key.account, minTTL: key.minTTL))
        } catch {
            let op = key.rejected == nil ? Operation.token : Operation.reject
            note(error, op: op.rawValue, account: key.account)
            return .failure(SharedErrorLine(error))
        }
    }

    /// The error line of `request`, noted in the debug log with what its client is told.
    private func failed(_ request: Request, _ error: BrokerError) -> [UInt8] {
        note(error, op: request.op, account: request.account)
        return errorLine(id: request.id, error)
    }

    /// Notes in the debug log that a request failed and what its client is told.
    private func note(_ error: BrokerError, op: String?, account: String?) {
        logger.debug(
            "request failed",
            metadata: [
                "op": "\(JSONText.quote(String((op ?? "").prefix(32))))",
                "account": "\(JSONText.quote(String((account ?? "").prefix(64))))",
                "code": "\(error.code.rawValue)", "message": "\(JSONText.quote(error.message))",
            ])
    }

    /// Runs a `login`: writes each progress line with `write` as it comes, and returns the
    /// final line. `peerPID` is the process on the other end of the connection.
    public func runLogin(_ request: Request, peerPID: Int32, write: @escaping @Sendable ([UInt8]) async -> Void)
        async -> [UInt8]
    {
        let id = request.id ?? .null
        do {
            let result = try await operations.login(request, peerPID: peerPID) { progress in
                var line = (try? Wire.makeEncoder().encode(LoginProgressLine(id: id, progress: progress))) ?? Data()
                line.append(0x0A)
                await write(Array(line))
            }
            return try success(request, result, Wire.makeEncoder())
        } catch let error as BrokerError {
            return failed(request, error)
        } catch {
            return failed(request, BrokerError(.internal, "the broker could not encode its answer"))
        }
    }

    /// The error line for `error`, as any connection-level failure also uses.
    public func errorLine(id: RequestID?, _ error: BrokerError) -> [UInt8] {
        Array(Wire.errorLine(id: id, error: error, encoder: Wire.makeEncoder()))
    }

    private func minTTL(_ requested: Double?) throws(BrokerError) -> TimeInterval {
        let value = requested ?? broker.settings.defaultMinTTL
        guard value >= 0, value <= Bounds.maximumLifetime else {
            throw BrokerError(.badRequest, "\"min_ttl\" must be 0 to \(Int(Bounds.maximumLifetime)) seconds")
        }
        return value
    }

    private func success(_ request: Request, _ result: some Encodable, _ encoder: JSONEncoder) throws -> [UInt8] {
        Array(try Wire.successLine(id: request.id, result: result, encoder: encoder))
    }
}

/// Just the id of a line whose other fields did not decode, so the error can still echo it.
private struct IDOnly: Decodable {
    var id: RequestID?
}

private enum AccountField {
    static func required(_ value: String?) throws(BrokerError) -> String {
        guard let value, !value.isEmpty else { throw BrokerError(.badRequest, "the field \"account\" is required") }
        return value
    }
}
