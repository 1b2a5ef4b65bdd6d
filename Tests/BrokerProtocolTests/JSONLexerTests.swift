import BrokerProtocol
import Testing

/// `JSONLexer`'s readers that the vault's plaintext reader stands on: a string's bytes without
/// a copy when it has no escapes, decoded when it has, refused when not UTF-8; any value skipped.
@Suite struct JSONLexerTests {
    @Test func aStringWithoutEscapesIsTheInputsOwnBytes() {
        let input = Array(#"  "plain ascii" "#.utf8)
        input.withUnsafeBytes { bytes in
            var lexer = JSONLexer(bytes)
            let start = lexer.withString { $0.baseAddress.map { $0 - bytes.baseAddress! } }
            let atEnd = lexer.atEnd()
            #expect(start == 3, "the bytes inside the quotes, where they lie")
            #expect(atEnd)
        }
    }

    @Test(arguments: [
        (#""a\"b\\c\/d\n\u00e9\ud83d\ude00""#, "a\"b\\c/d\né\u{1F600}"), (#""é€😀""#, "é€😀"), (#""""#, ""),
    ])
    func aStringIsDecoded(literal: String, text: String) {
        let input = Array(literal.utf8)
        input.withUnsafeBytes { bytes in
            var lexer = JSONLexer(bytes)
            let decoded = lexer.withString { Array($0) }
            #expect(decoded == Array(text.utf8))
        }
        input.withUnsafeBytes { bytes in
            var lexer = JSONLexer(bytes)
            let decoded = lexer.string()
            #expect(decoded == text)
        }
    }

    @Test(
        arguments: [[0x22, 0xC3, 0x28, 0x22], [0x22, 0xFF, 0x22], [0x22, 0x61, 0x0A, 0x22], [0x22, 0x61]] as [[UInt8]])
    func aStringThatIsNotValidIsRefused(input: [UInt8]) {
        input.withUnsafeBytes { bytes in
            var lexer = JSONLexer(bytes)
            let read = lexer.withString { _ in true }
            #expect(read == nil)
        }
        Array(#""\ud800x""#.utf8).withUnsafeBytes { bytes in
            var lexer = JSONLexer(bytes)
            let read = lexer.string()
            #expect(read == nil, "a lone surrogate")
        }
    }

    @Test func skipValueSkipsOneValueOfAnyKind() {
        let input = Array(#"{"a":[1,-2.5e-3,true,false,null,"x\"y",{}],"b":{"c":[]}} , 7"#.utf8)
        input.withUnsafeBytes { bytes in
            var lexer = JSONLexer(bytes)
            let skipped = lexer.skipValue()
            let comma = lexer.skip(JSONLexer.Byte.comma)
            let number = lexer.number()?.text
            #expect(skipped && comma && number == "7")
        }
    }

    @Test(arguments: [#"{"a":}"#, #"[1,]"#, #"{"a" 1}"#, #"[01]"#, #"tru"#, #"{"a":1"#, "", #"{1:2}"#])
    func skipValueRefusesWhatIsNotJSON(text: String) {
        Array(text.utf8).withUnsafeBytes { bytes in
            var lexer = JSONLexer(bytes)
            let whole = lexer.skipValue() && lexer.atEnd()
            #expect(!whole)
        }
    }

    @Test func skipValueStopsAtItsDepth() {
        let deep = String(repeating: "[", count: 10) + String(repeating: "]", count: 10)
        Array(deep.utf8).withUnsafeBytes { bytes in
            var shallow = JSONLexer(bytes)
            var enough = JSONLexer(bytes)
            let (tooDeep, deepEnough) = (shallow.skipValue(depth: 9), enough.skipValue(depth: 10))
            #expect(!tooDeep && deepEnough)
        }
    }
}
