"""Writes the hostile seeds of the decode_image fuzzer (issue 36): small
files that once took far more memory or time than their pixels promised.
The well-formed seeds beside them (every format and colour type, 40x30) came
from Pillow earlier and stay as they are.

    python3 fuzz/make_decode_seeds.py fuzz/seeds/decode_image

Needs only the standard library. Each seed stays under the fuzzer's
-max_len (65,536 bytes); the full-size cases (a 700 MB ICC profile, a
16383x8000 frame) are made by tests/python/test_decode_limits.py instead.
"""

import struct
import sys
import zlib
from pathlib import Path


def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png(ihdr, *chunks):
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + b"".join(chunks) + png_chunk(b"IEND", b"")


def zeros_deflated(mib):
    z = zlib.compressobj(9)
    return b"".join(z.compress(bytes(1 << 20)) for _ in range(mib)) + z.flush()


def riff(*chunks):
    body = b"WEBP" + b"".join(chunks)
    return b"RIFF" + struct.pack("<I", len(body)) + body


def riff_chunk(kind, payload):
    return kind + struct.pack("<I", len(payload)) + payload + (b"\0" if len(payload) % 2 else b"")


def le24(v):
    return v.to_bytes(3, "little")


def vp8x(flags, w, h):
    return riff_chunk(b"VP8X", bytes([flags, 0, 0, 0]) + le24(w - 1) + le24(h - 1))


def vp8_header(w, h, tail=64):
    """A VP8 key frame's header claiming w x h, then `tail` bytes of nothing."""
    return riff_chunk(b"VP8 ", bytes([0x10, 0x02, 0x00, 0x9D, 0x01, 0x2A]) + struct.pack("<HH", w, h) + bytes(tail))


def vp8l_header(w, h, alpha=False):
    bits = (w - 1) | (h - 1) << 14 | int(alpha) << 28
    return riff_chunk(b"VP8L", b"\x2f" + struct.pack("<I", bits) + bytes(16))


def anmf(x, y, w, h, frame):
    return riff_chunk(b"ANMF", le24(x // 2) + le24(y // 2) + le24(w - 1) + le24(h - 1) + le24(100) + b"\0" + frame)


def jpeg_header(w, h, marker=0xC0, factors=(0x22, 0x11, 0x11)):
    sof = bytes([8]) + struct.pack(">HH", h, w) + bytes([len(factors)])
    sof += b"".join(bytes([i + 1, f, 0]) for i, f in enumerate(factors))
    sos = bytes([len(factors)]) + b"".join(bytes([i + 1, 0]) for i in range(len(factors))) + bytes([0, 63, 0])
    return (b"\xff\xd8\xff" + bytes([marker]) + struct.pack(">H", len(sof) + 2) + sof +
            b"\xff\xda" + struct.pack(">H", len(sos) + 2) + sos + bytes(32) + b"\xff\xd9")


SEEDS = {
    # A 1x1 PNG whose ICC profile inflates to 48 MiB (the full-size one: 700 MB).
    "iccp-bomb.png": png(struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0),
                         png_chunk(b"iCCP", b"icc\0\0" + zeros_deflated(48)),
                         png_chunk(b"IDAT", zlib.compress(b"\0\1\2\3"))),
    # The same with a compressed text chunk and an EXIF chunk.
    "ztxt-bomb.png": png(struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0),
                         png_chunk(b"zTXt", b"Comment\0\0" + zeros_deflated(48)),
                         png_chunk(b"eXIf", b"MM\0*" + bytes(4096)),
                         png_chunk(b"IDAT", zlib.compress(b"\0\1\2\3"))),
    # A 1x1 canvas around a 16383x8000 lossy frame.
    "frame-over-canvas.webp": riff(vp8x(0, 1, 1), vp8_header(16383, 8000)),
    # An animation whose second frame does not fit its canvas, and one
    # whose frame's bitstream is larger than the frame's rectangle.
    "anmf-outside-canvas.webp": riff(vp8x(0x12, 64, 64), riff_chunk(b"ANIM", bytes(6)),
                                     anmf(0, 0, 64, 64, vp8l_header(64, 64, True)),
                                     anmf(32, 32, 64, 64, vp8l_header(64, 64, True))),
    "anmf-bitstream-too-big.webp": riff(vp8x(0x12, 64, 64), riff_chunk(b"ANIM", bytes(6)),
                                        anmf(0, 0, 16, 16, vp8_header(16000, 16000))),
    # Pillow's lossless 9000x9000 of one colour: 38 bytes, 81 Mpx.
    "lossless-9000.webp": bytes.fromhex(
        "524946461e000000574542505650384c110000002f27e3c9080750e42ad4a3ff8188e87f0000"),
    # A canvas of 2^30 pixels (image-webp's u32 size would wrap).
    "canvas-2e30.webp": riff(vp8x(0x02, 1 << 16, 1 << 14), riff_chunk(b"ANIM", bytes(6)),
                             anmf(0, 0, 16, 16, vp8l_header(16, 16))),
    # JPEG headers claiming the most pixels: baseline 4:2:0, progressive 4:4:4, CMYK.
    "huge-baseline.jpg": jpeg_header(65535, 65535),
    "huge-progressive-444.jpg": jpeg_header(9000, 9000, 0xC2, (0x11, 0x11, 0x11)),
    "huge-cmyk.jpg": jpeg_header(8000, 8000, 0xC2, (0x11, 0x11, 0x11, 0x11)),
    # A PNG header of 65535 x 65535 (12.9 GB of RGB).
    "huge.png": png(struct.pack(">IIBBBBB", 65535, 65535, 8, 2, 0, 0, 0), png_chunk(b"IDAT", b"x")),
}


def main():
    out = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "seeds" / "decode_image")
    out.mkdir(parents=True, exist_ok=True)
    for name, data in SEEDS.items():
        assert len(data) <= 65536, (name, len(data))
        (out / name).write_bytes(data)
        print(f"{name}: {len(data)} bytes")


if __name__ == "__main__":
    main()
