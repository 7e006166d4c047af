"""SPDY/3.1 framing, as far as the stand-in's `pods/portforward` needs it: what kubectl's port-forward (client-go over
moby/spdystream) sends and expects, tunnelled in WebSocket binary messages (subprotocol SPDY/3.1+portforward.k8s.io,
which kubectl 1.31+ asks for first) or on the upgraded socket itself (its fallback, `Upgrade: SPDY/3.1`).

Frames (draft-mbelshe-httpbis-spdy-00, version 3): a control frame is `1|version(15) type(16) flags(8) length(24)`
then its payload; a data frame `0|stream-id(31) flags(8) length(24)` then its bytes; flag 0x01 is FIN (that side is
done sending). Header blocks are zlib streams over one context per direction, with SPDY/3's dictionary, each block
ended by a sync flush. Only SYN_STREAM, SYN_REPLY, RST_STREAM, PING and data are acted on; SETTINGS, WINDOW_UPDATE,
HEADERS and GOAWAY are read and ignored (spdystream keeps no flow-control window of its own).
"""

from __future__ import annotations

import struct
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass

VERSION = 3
SYN_STREAM, SYN_REPLY, RST_STREAM, SETTINGS, PING, GOAWAY, HEADERS, WINDOW_UPDATE = 1, 2, 3, 4, 6, 7, 8, 9
FIN = 0x01
# SPDY/3's header dictionary (its zlib dictionary id: 0xe3c6a7c2), as the draft gives it.
DICTIONARY = (
    b'\x00\x00\x00\x07options\x00\x00\x00\x04head\x00\x00\x00\x04post\x00\x00\x00\x03put\x00\x00\x00\x06de'
    b'lete\x00\x00\x00\x05trace\x00\x00\x00\x06accept\x00\x00\x00\x0eaccept-charse'
    b't\x00\x00\x00\x0faccept-encoding\x00\x00\x00\x0faccept-language\x00'
    b'\x00\x00\raccept-ranges\x00\x00\x00\x03age\x00\x00\x00\x05allow\x00\x00\x00\rauth'
    b'orization\x00\x00\x00\rcache-control\x00\x00\x00\nconnection'
    b'\x00\x00\x00\x0ccontent-base\x00\x00\x00\x10content-encoding\x00\x00\x00\x10'
    b'content-language\x00\x00\x00\x0econtent-length\x00\x00\x00\x10co'
    b'ntent-location\x00\x00\x00\x0bcontent-md5\x00\x00\x00\rcontent'
    b'-range\x00\x00\x00\x0ccontent-type\x00\x00\x00\x04date\x00\x00\x00\x04etag\x00\x00'
    b'\x00\x06expect\x00\x00\x00\x07expires\x00\x00\x00\x04from\x00\x00\x00\x04host\x00\x00\x00\x08i'
    b'f-match\x00\x00\x00\x11if-modified-since\x00\x00\x00\rif-none-'
    b'match\x00\x00\x00\x08if-range\x00\x00\x00\x13if-unmodified-since'
    b'\x00\x00\x00\rlast-modified\x00\x00\x00\x08location\x00\x00\x00\x0cmax-for'
    b'wards\x00\x00\x00\x06pragma\x00\x00\x00\x12proxy-authenticate\x00\x00\x00'
    b'\x13proxy-authorization\x00\x00\x00\x05range\x00\x00\x00\x07referer'
    b'\x00\x00\x00\x0bretry-after\x00\x00\x00\x06server\x00\x00\x00\x02te\x00\x00\x00\x07trail'
    b'er\x00\x00\x00\x11transfer-encoding\x00\x00\x00\x07upgrade\x00\x00\x00\nus'
    b'er-agent\x00\x00\x00\x04vary\x00\x00\x00\x03via\x00\x00\x00\x07warning\x00\x00\x00\x10ww'
    b'w-authenticate\x00\x00\x00\x06method\x00\x00\x00\x03get\x00\x00\x00\x06statu'
    b's\x00\x00\x00\x06200 OK\x00\x00\x00\x07version\x00\x00\x00\x08HTTP/1.1\x00\x00\x00\x03ur'
    b'l\x00\x00\x00\x06public\x00\x00\x00\nset-cookie\x00\x00\x00\nkeep-alive\x00'
    b'\x00\x00\x06origin1001012012022052063003023033043'
    b'0530630740240540640740840941041141241341'
    b'4415416417502504505203 Non-Authoritative'
    b' Information204 No Content301 Moved Perm'
    b'anently400 Bad Request401 Unauthorized40'
    b'3 Forbidden404 Not Found500 Internal Ser'
    b'ver Error501 Not Implemented503 Service '
    b'UnavailableJan Feb Mar Apr May Jun Jul A'
    b'ug Sept Oct Nov Dec 00:00:00 Mon, Tue, W'
    b'ed, Thu, Fri, Sat, Sun, GMTchunked,text/'
    b'html,image/png,image/jpg,image/gif,appli'
    b'cation/xml,application/xhtml+xml,text/pl'
    b'ain,text/javascript,publicprivatemax-age'
    b'=gzip,deflate,sdchcharset=utf-8charset=i'
    b'so-8859-1,utf-,*,enq=0.')


@dataclass(frozen=True)
class Frame:
    """One frame: control (kind is its type) or data (kind 0); stream 0 for control frames without one."""

    control: bool
    kind: int
    flags: int
    stream: int
    payload: bytes  # a control frame's payload after its stream id (if it has one); a data frame's bytes

    @property
    def fin(self) -> bool:
        return bool(self.flags & FIN)


class Codec:
    """One connection's frames: read from `read_exact`, written through `send` (several threads write)."""

    def __init__(self, read_exact: Callable[[int], bytes], send: Callable[[bytes], None]) -> None:
        self._read_exact = read_exact
        self._send = send
        self._lock = threading.Lock()
        self._inflate = zlib.decompressobj(zdict=DICTIONARY)
        self._deflate = zlib.compressobj(zdict=DICTIONARY)

    def receive(self) -> Frame:
        first, second = struct.unpack("!II", self._read_exact(8))
        flags, size = second >> 24, second & 0xFFFFFF
        payload = self._read_exact(size)
        if not first & 0x80000000:
            return Frame(False, 0, flags, first & 0x7FFFFFFF, payload)
        kind = first & 0xFFFF
        with_stream = kind in (SYN_STREAM, SYN_REPLY, RST_STREAM, HEADERS, WINDOW_UPDATE)
        stream = struct.unpack("!I", payload[:4])[0] & 0x7FFFFFFF if with_stream else 0
        return Frame(True, kind, flags, stream, payload[4:] if with_stream else payload)

    def headers(self, frame: Frame) -> dict[str, str]:
        """A SYN_STREAM's headers (after its associated stream id, priority and slot)."""
        block = self._inflate.decompress(frame.payload[6:])
        (count,), at, found = struct.unpack("!I", block[:4]), 4, {}
        for _ in range(count):
            pair = []
            for _ in range(2):
                (size,) = struct.unpack("!I", block[at:at + 4])
                pair.append(block[at + 4:at + 4 + size].decode())
                at += 4 + size
            found[pair[0]] = pair[1]
        return found

    def control(self, kind: int, payload: bytes, flags: int = 0) -> None:
        self._write(struct.pack("!HHI", 0x8000 | VERSION, kind, flags << 24 | len(payload)) + payload)

    def reply(self, stream: int) -> None:
        """SYN_REPLY with no headers: the stream is accepted."""
        with self._lock:  # the deflate context's blocks go out in the order they are made
            block = self._deflate.compress(struct.pack("!I", 0)) + self._deflate.flush(zlib.Z_SYNC_FLUSH)
            payload = struct.pack("!I", stream) + block
            self._send(struct.pack("!HHI", 0x8000 | VERSION, SYN_REPLY, len(payload)) + payload)

    def data(self, stream: int, data: bytes, fin: bool = False) -> None:
        self._write(struct.pack("!II", stream, (FIN if fin else 0) << 24 | len(data)) + data)

    def _write(self, data: bytes) -> None:
        with self._lock:
            self._send(data)
