import BrokerEngine
import BrokerProtocol

/// Work a connection hands to its task (`ConnectionSession`).
enum ConnectionWork: Sendable {
    /// A request to run on the broker; its answer comes back as `ConnectionReply.answer`.
    case run(Request)
    /// A subscription whose events are to be written as they come.
    case subscribe(id: RequestID, events: EventHub.Events)
    /// A `login` from process `peerPID`: its progress comes back as `ConnectionReply.event`
    /// lines, its answer as `ConnectionReply.answer`; it is cancelled when the connection closes.
    case login(Request, peerPID: Int32)
}
