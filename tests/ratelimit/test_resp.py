"""The sans-I/O RESP2 codec: replies replayed whole, byte by byte and at random splits."""

from __future__ import annotations

import random

import pytest

from gateway.ratelimit.resp import ReplyParser, RespError, RespProtocolError, encode

REPLIES = (
    b"+OK\r\n"
    b"-NOSCRIPT No matching script. Please use EVAL.\r\n"
    b":42\r\n"
    b":-1\r\n"
    b"$5\r\nhello\r\n"
    b"$-1\r\n"
    b"$0\r\n\r\n"
    b"*-1\r\n"
    b"*0\r\n"
    b"$4\r\na\r\nb\r\n"  # CRLF inside a bulk string is data
    b"*5\r\n:0\r\n$3\r\n599\r\n$0\r\n\r\n$17\r\n46547.12345678901\r\n:20423\r\n"
    b"*2\r\n*1\r\n-ERR inner\r\n+\xc3\xbc\r\n"
)


def expected() -> list[object]:
    return [
        "OK",
        ("NOSCRIPT", "NOSCRIPT No matching script. Please use EVAL."),
        42,
        -1,
        b"hello",
        None,
        b"",
        None,
        [],
        b"a\r\nb",
        [0, b"599", b"", b"46547.12345678901", 20423],
        [[("ERR", "ERR inner")], "ü"],
    ]


def comparable(reply: object) -> object:
    if isinstance(reply, RespError):
        return (reply.code, str(reply))
    if isinstance(reply, list):
        return [comparable(r) for r in reply]
    return reply


def drain(parser: ReplyParser) -> list[object]:
    out: list[object] = []
    while True:
        done, reply = parser.next_reply()
        if not done:
            return out
        out.append(comparable(reply))


def replay(pieces: list[bytes]) -> list[object]:
    parser = ReplyParser()
    out: list[object] = []
    for piece in pieces:
        parser.feed(piece)
        out += drain(parser)
    parser.feed_eof()
    assert parser.buffered == 0
    return out


def test_whole() -> None:
    assert replay([REPLIES]) == expected()


def test_byte_by_byte() -> None:
    assert replay([REPLIES[i : i + 1] for i in range(len(REPLIES))]) == expected()


@pytest.mark.parametrize("seed", range(20))
def test_random_splits(seed: int) -> None:
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(REPLIES)), rng.randint(1, 12)))
    pieces = [REPLIES[a:b] for a, b in zip([0, *cuts], [*cuts, len(REPLIES)], strict=True)]
    assert replay(pieces) == expected()


def test_encode() -> None:
    assert encode("EVALSHA", "ab", 2, "k1", b"\x00", -5, 1.5, "ü") == (
        b"*8\r\n$7\r\nEVALSHA\r\n$2\r\nab\r\n$1\r\n2\r\n$2\r\nk1\r\n$1\r\n\x00\r\n"
        b"$2\r\n-5\r\n$3\r\n1.5\r\n$2\r\n\xc3\xbc\r\n"
    )
    with pytest.raises(TypeError):
        encode("SET", True)
    with pytest.raises(ValueError):
        encode()


@pytest.mark.parametrize(
    ("data", "caps"),
    [
        (b"?what\r\n", {}),  # not a RESP2 type byte
        (b":4x\r\n", {}),
        (b"$\r\n", {}),
        (b"$3\r\nabcde\r\n", {}),  # no CRLF after the bulk
        (b"$-2\r\n", {}),
        (b"*-3\r\n", {}),
        (b"$11\r\nhello world\r\n", {"max_bulk": 10}),
        (b"*3\r\n:1\r\n:2\r\n:3\r\n", {"max_items": 2}),
        (b"*1\r\n*1\r\n*1\r\n:1\r\n", {"max_depth": 2}),
        (b"+" + b"x" * 100, {"max_line": 64}),  # a line that never ends
        (b"+" + b"x" * 100 + b"\r\n", {"max_line": 64}),
        (b"$100\r\n" + b"x" * 50, {"max_buffer": 40}),
    ],
)
def test_protocol_errors_and_caps(data: bytes, caps: dict[str, int]) -> None:
    parser = ReplyParser(**caps)
    with pytest.raises(RespProtocolError):
        parser.feed(data)
        drain(parser)
    with pytest.raises(RespProtocolError):  # done for good: the connection must close
        parser.next_reply()


def test_eof_inside_a_reply_is_an_error() -> None:
    parser = ReplyParser()
    parser.feed(b"*2\r\n:1\r\n")
    assert drain(parser) == []
    with pytest.raises(RespProtocolError):
        parser.feed_eof()


def test_an_error_reply_is_a_value_with_its_code() -> None:
    parser = ReplyParser()
    parser.feed(b"-OOM command not allowed when used memory > 'maxmemory'.\r\n")
    done, reply = parser.next_reply()
    assert done and isinstance(reply, RespError) and reply.code == "OOM"
    assert isinstance(RespProtocolError("x"), ConnectionError)  # a store failure (OSError)
