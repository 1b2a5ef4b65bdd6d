import BrokerProtocol
import NIOCore
import Testing

@testable import BrokerServer

/// `LineFramer` on its own: lines cut from arbitrary reads, bounded before they are whole.
@Suite struct LineFramerTests {
    func buffer(_ text: String) -> ByteBuffer { ByteBuffer(string: text) }

    func lines(_ framer: inout LineFramer) throws -> [String] {
        var taken: [String] = []
        while let line = try framer.nextLine() { taken.append(String(buffer: line)) }
        return taken
    }

    @Test func linesSplitAcrossReadsComeOutWhole() throws {
        var framer = LineFramer(limit: 100)
        framer.append(buffer("{\"id\":1}\n{\"id\""))
        #expect(try lines(&framer) == ["{\"id\":1}"])
        #expect(!framer.isEmpty)
        framer.append(buffer(":2}\r\n\n"))
        #expect(try lines(&framer) == ["{\"id\":2}", ""])
        #expect(framer.isEmpty)
    }

    @Test func aLineIsRefusedAsSoonAsItGrowsPastTheLimitWithoutWaitingForItsEnd() {
        var framer = LineFramer(limit: 8)
        framer.append(buffer("12345678"))
        #expect(throws: Never.self) { try framer.nextLine() }
        framer.append(buffer("9"))
        #expect(throws: LineTooLongError.self) { try framer.nextLine() }
    }

    @Test func aWholeLineLongerThanTheLimitIsRefused() {
        var framer = LineFramer(limit: 4)
        framer.append(buffer("123456\n"))
        #expect(throws: LineTooLongError.self) { try framer.nextLine() }
    }

    @Test func aLineOfExactlyTheLimitIsTaken() throws {
        var framer = LineFramer(limit: 4)
        framer.append(buffer("1234\n"))
        #expect(try lines(&framer) == ["1234"])
    }

    @Test func compactingLetsGoOfTheReadBuffer() throws {
        var framer = LineFramer(limit: 100)
        var big = ByteBufferAllocator().buffer(capacity: 64 * 1024)
        big.writeString("{\"id\":1}\n{\"half")
        framer.append(big)
        #expect(try lines(&framer) == ["{\"id\":1}"])
        #expect(framer.heldBytes >= 64 * 1024)
        framer.compact(allocator: ByteBufferAllocator())
        #expect(framer.heldBytes < 1024)
        framer.append(buffer("\":2}\n"))
        #expect(try lines(&framer) == ["{\"half\":2}"])
        framer.compact(allocator: ByteBufferAllocator())
        #expect(framer.heldBytes == 0)
    }
}
