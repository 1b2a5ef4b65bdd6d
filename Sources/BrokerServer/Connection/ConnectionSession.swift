import BrokerEngine
import BrokerIdP
import BrokerModel
import BrokerProtocol
import BrokerSecrets
import BrokerVault
import NIOCore
import ServiceLifecycle

/// The task of one admitted connection. It runs the requests and forwards the subscriptions
/// its `ConnectionHandler` passes on, each as a child task, so the server's task group (and
/// with it a graceful shutdown) waits for every one of them.
enum ConnectionSession {
    /// Serves `connection` of `caller` until it closes; at graceful shutdown, asks its handler
    /// to drain it.
    static func run(
        _ connection: NIOAsyncChannel<ConnectionWork, ConnectionReply>, caller: Caller, dispatcher: RequestDispatcher,
        retryAfterMs: Int
    ) async {
        let channel = connection.channel
        await withGracefulShutdownHandler {
            try? await connection.executeThenClose { inbound, outbound in
                var work = inbound.makeAsyncIterator()
                var first = try await work.next()
                guard first != nil else { return }
                await serve(
                    &first, then: &work, outbound: outbound, allocator: channel.allocator, caller: caller,
                    dispatcher: dispatcher, retryAfterMs: retryAfterMs)
            }
        } onGracefulShutdown: {
            channel.triggerUserOutboundEvent(DrainConnection(), promise: nil)
        }
    }

    /// Runs `first` and every later piece of work as child tasks until the connection closes.
    /// Kept out of `run` so a connection that only ever gets inline answers, as most do, never
    /// holds the task groups' frames.
    ///
    /// No piece of work outlives its child task here: `first` is taken from the caller, and
    /// each piece is let go of before the next is awaited. A request holds the secrets it
    /// carried (an `add`'s refresh token) as strings, freed (and so wiped) only when the last
    /// reference goes, and a connection may stay open for hours after its first and its latest
    /// request (docs/security.md, "Secrets in memory").
    @inline(never)
    private static func serve(
        _ first: inout ConnectionWork?, then work: inout NIOAsyncChannelInboundStream<ConnectionWork>.AsyncIterator,
        outbound: NIOAsyncChannelOutboundWriter<ConnectionReply>, allocator: ByteBufferAllocator, caller: Caller,
        dispatcher: RequestDispatcher, retryAfterMs: Int
    ) async {
        // Requests are never cancelled (a refresh may be shared with other clients);
        // subscriptions and logins (whose user is gone) end with the connection.
        await withDiscardingTaskGroup { requests in
            await withDiscardingTaskGroup { endingWithConnection in
                /// Starts `item` as a child task; the item goes with the call.
                func start(_ item: ConnectionWork) {
                    switch item {
                    case .run(let request):
                        requests.addTask {
                            let line = await dispatcher.run(request, caller: caller)
                            try? await outbound.write(.answer(allocator.buffer(bytes: line)))
                        }
                    case .login(let request, let peerPID):
                        endingWithConnection.addTask {
                            let line = await dispatcher.runLogin(request, peerPID: peerPID) { progress in
                                try? await outbound.write(.event(allocator.buffer(bytes: progress)))
                            }
                            try? await outbound.write(.answer(allocator.buffer(bytes: line)))
                        }
                    case .subscribe(let id, let events):
                        endingWithConnection.addTask {
                            await forward(
                                events, id: id, to: outbound, allocator: allocator, caller: caller,
                                dispatcher: dispatcher, retryAfterMs: retryAfterMs)
                        }
                    }
                }
                var next = first.take()
                while next != nil {
                    start(next.take()!)
                    next = try? await work.next()
                }
                endingWithConnection.cancelAll()
            }
        }
    }

    /// Writes each event of an account `caller` may use (under the rules in force when it
    /// comes) as it comes; the writer waits while the peer does not read. A subscriber whose
    /// buffer overflowed meanwhile gets a final `busy` line and is disconnected.
    private static func forward(
        _ events: EventHub.Events, id: RequestID, to outbound: NIOAsyncChannelOutboundWriter<ConnectionReply>,
        allocator: ByteBufferAllocator, caller: Caller, dispatcher: RequestDispatcher, retryAfterMs: Int
    ) async {
        let encoder = Wire.makeEncoder()
        do {
            for try await event in events where dispatcher.mayShow(event.account.rawValue, to: caller) {
                let line = dispatcher.eventLine(id: id, event, encoder: encoder)
                try await outbound.write(.event(allocator.buffer(bytes: line)))
            }
        } catch is SubscriberTooSlow {
            let error = BrokerError(
                .busy, "events were not read fast enough; subscribe again", retryAfterMs: retryAfterMs)
            try? await outbound.write(.farewell(allocator.buffer(bytes: dispatcher.errorLine(id: id, error))))
        } catch {}
    }
}
