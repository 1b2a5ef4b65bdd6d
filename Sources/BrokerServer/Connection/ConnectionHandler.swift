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

/// Asks a connection to finish (graceful shutdown): read nothing more, answer the requests
/// that are running, then close.
struct DrainConnection {}

/// One client connection on its event loop: cuts lines, answers cached tokens and errors
/// inline, hands other requests and subscriptions to the connection's task, and keeps the
/// connection within `ConnectionLimits`.
///
/// No next line is taken while the answers queued for the peer are above the channel's
/// high-water mark or while `requestsPerConnection` requests run; lines already received then
/// wait here and nothing more is read, so a client that does not read its answers is no
/// longer read from. One file for the handler: reading, the inline answers and back-pressure
/// share the channel's state and must be read together to see that no line is lost.
final class ConnectionHandler: ChannelDuplexHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ConnectionWork
    typealias OutboundIn = ConnectionReply
    typealias OutboundOut = ByteBuffer

    private enum State {
        case open
        /// Finishing the running requests before closing, until the deadline.
        case draining(deadline: NIODeadline)
        /// A last line is on its way; closed when it has left or at the deadline.
        case closing(deadline: NIODeadline)
        case closed
    }

    private let dispatcher: RequestDispatcher
    /// The caller and what it may use.
    private var access: CallerAccess
    private var peer: PeerIdentity { access.caller.peer }
    private let quota: ConnectionQuota
    private let limitLog: LimitLog
    private let logger: Logger
    private let tickFlush: TickFlush
    private let decoder = Wire.makeDecoder()
    private var limits: ConnectionLimits { quota.limits }

    private var state = State.open
    private var framer = LineFramer()
    /// Requests handed to the task or waiting for a refresh (`tickets`), not answered yet.
    private var requests = 0
    /// The requests of this connection that wait for a refresh.
    private var tickets: Set<RefreshWaiters.Ticket> = []
    private var subscriptions = 0
    /// Bytes this connection holds on the quota's shared budget.
    private var budgetDrawn = 0
    /// A `read` that was held back because no line may be taken now.
    private var readHeld = false
    private var flushPending = false
    /// Whether work was passed on outside a read, so the task still has to be told.
    private var workPending = false
    /// When the peer last sent something or was last answered.
    private var lastActivity = NIODeadline.now()
    /// When the half-sent line now waiting began to arrive.
    private var partialLineSince: NIODeadline?
    private var timer: (deadline: NIODeadline, task: Scheduled<Void>)?

    /// Takes over a connection slot already reserved on `quota` for the caller.
    init(
        dispatcher: RequestDispatcher, access: CallerAccess, quota: ConnectionQuota, limitLog: LimitLog, logger: Logger,
        tickFlush: TickFlush
    ) {
        self.dispatcher = dispatcher
        self.access = access
        self.quota = quota
        self.limitLog = limitLog
        self.logger = logger
        self.tickFlush = tickFlush
    }

    func channelActive(context: ChannelHandlerContext) {
        lastActivity = context.eventLoop.now
        rearmTimer(context: context)
        context.fireChannelActive()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        state = .closed
        framer.discard()
        timer?.task.cancel()
        timer = nil
        for ticket in tickets { dispatcher.waiters.cancel(ticket) }
        tickets = []
        quota.releaseConnection(
            uid: peer.uid, requests: requests, subscriptions: subscriptions, budgetBytes: budgetDrawn)
        requests = 0
        subscriptions = 0
        budgetDrawn = 0
    }

    // MARK: Reading

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard case .open = state else { return }
        framer.append(unwrapInboundIn(data))
        lastActivity = context.eventLoop.now
        takeLines(context: context)
    }

    /// Has the answers written inline flushed with the others of this tick (`TickFlush`); the
    /// read's end goes on to the connection's task only when work was passed to it (not after
    /// a read of cached tokens only).
    func channelReadComplete(context: ChannelHandlerContext) {
        if flushPending {
            flushPending = false
            tickFlush.flushAfterTick(context)
        }
        guard workPending else { return }
        workPending = false
        context.fireChannelReadComplete()
    }

    func read(context: ChannelHandlerContext) {
        if mayTakeLine(context: context) {
            context.read()
        } else {
            readHeld = true
        }
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable { resume(context: context) }
        context.fireChannelWritabilityChanged()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        close(context: context)
    }

    /// Whether the next line may be taken: the connection is open, the peer reads its answers
    /// and fewer than `requestsPerConnection` requests run.
    private func mayTakeLine(context: ChannelHandlerContext) -> Bool {
        guard case .open = state else { return false }
        return requests < limits.requestsPerConnection && context.channel.isWritable
    }

    /// Takes and handles lines while that is allowed, then settles what the waiting bytes hold.
    private func takeLines(context: ChannelHandlerContext) {
        // The time the lines taken now are judged by, read once for them all.
        var now: Date?
        while mayTakeLine(context: context) {
            let line: ByteBuffer?
            do {
                line = try framer.nextLine()
            } catch {
                refuseLongLine(context: context)
                return
            }
            guard let line else {
                if !framer.isEmpty, partialLineSince == nil { partialLineSince = context.eventLoop.now }
                break
            }
            partialLineSince = nil
            let time = now ?? dispatcher.broker.clock.now()
            now = time
            handle(line, now: time, context: context)
        }
        guard case .open = state else { return }
        settleHeldBytes(context: context)
        rearmTimer(context: context)
    }

    /// Takes lines again after an answer left or the peer read, then reads again if allowed.
    private func resume(context: ChannelHandlerContext) {
        guard case .open = state else { return }
        takeLines(context: context)
        flushIfPending(context: context)
        if workPending {
            workPending = false
            context.fireChannelReadComplete()
        }
        if readHeld, mayTakeLine(context: context) {
            readHeld = false
            context.read()
        }
    }

    private func handle(_ line: ByteBuffer, now: Date, context: ChannelHandlerContext) {
        // Decoded, the line is wiped where it lies: the read buffer may outlive it, and a line
        // may carry tokens, a client secret or a passphrase.
        defer { LineFramer.wipe(line) }
        let decision = line.withUnsafeReadableBytes { bytes in
            dispatcher.decide(line: bytes, access: &access, decoder: decoder, now: now)
        }
        switch decision {
        case .immediate(let bytes):
            write(bytes, context: context)
        case .cached(let token, let id, let now):
            write(token, id: id, now: now, proof: nil, context: context)
        case .prove(let token, let dpop, let id, let now):
            prove(token, for: dpop, id: id, now: now, context: context)
        case .awaitToken(let key, let id):
            awaitToken(key, id: id, context: context)
        case .deferred(let request):
            run(request, as: .run(request), context: context)
        case .login(let request):
            run(request, as: .login(request, peerPID: peer.pid), context: context)
        case .subscribe(let ack, let id, let events):
            // A refused subscription ends here: dropping `events` ends it in the hub.
            guard subscriptions < limits.subscriptionsPerConnection else {
                limitLog.hit("subscriptions per connection", peer: peer)
                let message = "a connection may hold \(limits.subscriptionsPerConnection) subscriptions"
                write(busy(id: id, message), context: context)
                return
            }
            guard quota.reserve(.subscription, uid: peer.uid) else {
                limitLog.hit("subscriptions per uid", peer: peer)
                let message = "uid \(peer.uid) holds \(limits.subscriptionsPerUID) subscriptions"
                write(busy(id: id, message), context: context)
                return
            }
            subscriptions += 1
            write(ack, context: context)
            pass(.subscribe(id: id, events: events), context: context)
        }
    }

    /// Hands `request` to the task as `work`, counted as a running request, unless the peer's
    /// uid runs too many.
    private func run(_ request: Request, as work: ConnectionWork, context: ChannelHandlerContext) {
        guard reserveRequest(id: request.id, context: context) else { return }
        pass(work, context: context)
    }

    /// Counts one more running request, unless the peer's uid runs too many: then request `id`
    /// is answered `busy`.
    private func reserveRequest(id: RequestID?, context: ChannelHandlerContext) -> Bool {
        guard quota.reserve(.request, uid: peer.uid) else {
            limitLog.hit("requests per uid", peer: peer)
            let message = "uid \(peer.uid) has \(limits.requestsPerUID) requests running"
            write(busy(id: id, message), context: context)
            return false
        }
        requests += 1
        return true
    }

    /// Holds a `token` or `reject` request until the token for `key` is fetched
    /// (`RefreshWaiters`), counted as a running request like one handed to the task.
    private func awaitToken(_ key: RefreshWaiters.Key, id: RequestID?, context: ChannelHandlerContext) {
        guard reserveRequest(id: id, context: context) else { return }
        let ticket = dispatcher.waiters.wait(
            for: key, on: context.eventLoop,
            answer: { ticket, outcome in self.answerWaiting(ticket, outcome, id: id, context: context) },
            fetch: { [dispatcher] in await dispatcher.fetchToken(key) })
        tickets.insert(ticket)
    }

    /// Answers a request that waited for a refresh, as the task's answers are answered.
    private func answerWaiting(
        _ ticket: RefreshWaiters.Ticket, _ outcome: RefreshWaiters.Outcome, id: RequestID?,
        context: ChannelHandlerContext
    ) {
        // Not held any more: the connection closed (and gave back its requests).
        guard tickets.remove(ticket) != nil else { return }
        switch outcome {
        case .success(let token): write(token, id: id, now: dispatcher.broker.clock.now(), proof: nil, context: context)
        case .failure(let shared): write(shared.line(id: id), context: context)
        }
        flushIfPending(context: context)
        requestAnswered(context: context)
    }

    /// Answers a cached token with a proof for the request `dpop` names, checked and signed on
    /// `RequestDispatcher.signers` (or refused there, answered with why) and written back on the
    /// connection's event loop, counted as a running request.
    private func prove(
        _ token: PreparedToken, for dpop: DPoPRequest, id: RequestID?, now: Date, context: ChannelHandlerContext
    ) {
        guard reserveRequest(id: id, context: context) else { return }
        RequestDispatcher.signers.runIfActive(eventLoop: context.eventLoop) {
            RequestDispatcher.proof(token, for: dpop, now: now)
        }
        .assumeIsolated().whenComplete { result in
            // Once closed, `handlerRemoved` gave the request back.
            if case .closed = self.state { return }
            switch result {
            case .success(.success(let proof)):
                self.write(token, id: id, now: now, proof: proof, context: context)
            case .success(.failure(let error)):
                self.write(self.dispatcher.errorLine(id: id, error), context: context)
            case .failure:
                self.write(self.dispatcher.errorLine(id: id, RequestDispatcher.signingFailed), context: context)
            }
            self.flushIfPending(context: context)
            self.requestAnswered(context: context)
        }
    }

    private func pass(_ work: ConnectionWork, context: ChannelHandlerContext) {
        context.fireChannelRead(wrapInboundOut(work))
        workPending = true
    }

    /// Keeps the bytes still waiting in a buffer of their own and draws what they hold beyond
    /// the allowance from the shared budget; a connection that would overdraw it is refused.
    private func settleHeldBytes(context: ChannelHandlerContext) {
        framer.compact(allocator: context.channel.allocator)
        let wanted = max(0, framer.heldBytes - limits.partialLineAllowance)
        if wanted > budgetDrawn {
            guard quota.draw(bytes: wanted - budgetDrawn) else {
                limitLog.hit("half-sent line budget", peer: peer)
                refuse(busy(id: nil, "the broker holds too many half-sent lines; send whole lines"), context: context)
                return
            }
        } else if wanted < budgetDrawn {
            quota.giveBack(bytes: budgetDrawn - wanted)
        }
        budgetDrawn = wanted
    }

    // MARK: Writing

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        switch unwrapOutboundIn(data) {
        case .answer(let line):
            context.write(wrapOutboundOut(line), promise: promise)
            requestAnswered(context: context)
        case .event(let line):
            context.write(wrapOutboundOut(line), promise: promise)
        case .farewell(let line):
            context.write(wrapOutboundOut(line), promise: promise)
            closeAfterFlush(context: context)
        }
    }

    /// Counts a request as answered, then does what that allows: closes a draining connection
    /// that has answered everything, or takes the lines held back.
    private func requestAnswered(context: ChannelHandlerContext) {
        // Once closed, `handlerRemoved` gives back every request still counted.
        if case .closed = state { return }
        requests -= 1
        quota.releaseRequest(uid: peer.uid)
        lastActivity = context.eventLoop.now
        switch state {
        case .draining where requests == 0:
            closeAfterFlush(context: context)
        case .open where readHeld || !framer.isEmpty:
            // Not from inside a write: taking lines may write and pass work on itself.
            context.eventLoop.assumeIsolated().execute { self.resume(context: context) }
        case .open:
            rearmTimer(context: context)
        case .draining, .closing, .closed:
            break
        }
    }

    /// Writes the answer to request `id` with `token`, from guarded memory straight into the
    /// outgoing buffer.
    private func write(
        _ token: PreparedToken, id: RequestID?, now: Date, proof: String?, context: ChannelHandlerContext
    ) {
        var buffer = context.channel.allocator.buffer(capacity: token.lineCapacity + (proof?.utf8.count ?? 0))
        token.write(id: id, now: now, proof: proof, into: &buffer)
        context.write(wrapOutboundOut(buffer), promise: nil)
        flushPending = true
    }

    private func write(_ bytes: [UInt8], context: ChannelHandlerContext) {
        context.write(wrapOutboundOut(context.channel.allocator.buffer(bytes: bytes)), promise: nil)
        flushPending = true
    }

    private func flushIfPending(context: ChannelHandlerContext) {
        guard flushPending else { return }
        flushPending = false
        context.flush()
    }

    private func busy(id: RequestID?, _ message: String) -> [UInt8] {
        dispatcher.errorLine(id: id, BrokerError(.busy, message, retryAfterMs: limits.retryAfterMs))
    }

    // MARK: Closing

    func triggerUserOutboundEvent(context: ChannelHandlerContext, event: Any, promise: EventLoopPromise<Void>?) {
        guard event is DrainConnection else {
            context.triggerUserOutboundEvent(event, promise: promise)
            return
        }
        promise?.succeed()
        guard case .open = state else { return }
        state = .draining(deadline: context.eventLoop.now + limits.drainTimeout)
        if requests == 0 {
            closeAfterFlush(context: context)
        } else {
            rearmTimer(context: context)
        }
    }

    private func refuseLongLine(context: ChannelHandlerContext) {
        logger.notice("closed a connection that sent an oversized line", metadata: ["peer": "\(peer)"])
        let message = "a request line may be at most \(maximumLineLength) bytes"
        refuse(dispatcher.errorLine(id: nil, BrokerError(.lineTooLong, message)), context: context)
    }

    /// Sends `line` as the last thing on this connection and closes it.
    private func refuse(_ line: [UInt8], context: ChannelHandlerContext) {
        write(line, context: context)
        closeAfterFlush(context: context)
    }

    /// Closes once everything written so far has reached the socket, or after `drainTimeout`
    /// if the peer does not read it. Received bytes are let go of at once.
    private func closeAfterFlush(context: ChannelHandlerContext) {
        state = .closing(deadline: context.eventLoop.now + limits.drainTimeout)
        framer.discard()
        quota.giveBack(bytes: budgetDrawn)
        budgetDrawn = 0
        rearmTimer(context: context)
        let channel = context.channel
        context.writeAndFlush(wrapOutboundOut(channel.allocator.buffer(capacity: 0))).whenComplete { _ in
            channel.close(promise: nil)
        }
    }

    private func close(context: ChannelHandlerContext) {
        state = .closed
        context.close(promise: nil)
    }

    // MARK: Timeouts

    /// Whether the connection has nothing to do: no request running, no subscription and no
    /// received bytes waiting.
    private var isIdle: Bool { requests == 0 && subscriptions == 0 && framer.isEmpty }

    private func nextDeadline() -> NIODeadline? {
        switch state {
        case .closed: return nil
        case .draining(let deadline), .closing(let deadline): return deadline
        case .open:
            if let partialLineSince { return partialLineSince + limits.lineTimeout }
            return isIdle ? lastActivity + limits.idleTimeout : nil
        }
    }

    /// Makes sure the timer fires no later than the next deadline; an earlier timer just
    /// looks again when it fires, so the fast path rarely touches the timer at all.
    private func rearmTimer(context: ChannelHandlerContext) {
        guard let deadline = nextDeadline() else { return }
        if let timer, timer.deadline <= deadline { return }
        timer?.task.cancel()
        let task = context.eventLoop.assumeIsolated().scheduleTask(deadline: deadline) {
            self.timer = nil
            self.timerFired(context: context)
        }
        timer = (deadline, task)
    }

    private func timerFired(context: ChannelHandlerContext) {
        guard let deadline = nextDeadline() else { return }
        guard deadline <= context.eventLoop.now else { return rearmTimer(context: context) }
        switch state {
        case .closed:
            return
        case .draining, .closing:
            close(context: context)
        case .open where partialLineSince != nil:
            limitLog.hit("line timeout", peer: peer)
            close(context: context)
        case .open:
            logger.debug("closed an idle connection", metadata: ["peer": "\(peer)"])
            close(context: context)
        }
    }
}
