"""The memory a decode takes from the stage's budget (its headers' bound,
`memory_bytes`) against the heap it really holds (`heap_peak_bytes`, counted
by decode_file's allocator), for every kind of image the stage reads
(issue 36, item 7): the bound must hold, or the budget would not bound the
stage, and stay within a small factor of it, or the budget would refuse or
serialize images that fit.

decode_file is engine/decode/examples/decode_file.rs (`cargo build --release
-p ringfeed-decode --examples`); $RINGFEED_DECODE_FILE overrides its path.
Run with -s for the figures."""

import io
import json
import os
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

REPO = Path(__file__).resolve().parents[2]
TOOL = Path(os.environ.get("RINGFEED_DECODE_FILE", REPO / "target" / "release" / "examples" / "decode_file"))
MIB = 1 << 20


def photo(w, h, seed=0):
    rng = np.random.default_rng(seed)
    y = np.linspace(0, 1, h)[:, None]
    x = np.linspace(0, 1, w)[None, :]
    planes = [200 * x + 30 * np.sin(40 * y), 180 * y + 0 * x, 120 * (x * y) + 60]
    base = np.stack([np.broadcast_to(p, (h, w)) for p in planes], -1)
    return Image.fromarray((base + rng.normal(0, 10, (h, w, 3))).clip(0, 255).astype(np.uint8))


def encode(im, fmt, **kw):
    out = io.BytesIO()
    im.save(out, fmt, **kw)
    return out.getvalue()


def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png16_rgba(im):
    arr = np.asarray(im.convert("RGBA")).astype(">u2") * 257
    h, w, _ = arr.shape
    raw = b"".join(b"\0" + arr[y].tobytes() for y in range(h))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, 6, 0, 0, 0)) + \
        chunk(b"IDAT", zlib.compress(raw, 1)) + chunk(b"IEND", b"")


def png_gray_adam7(im):
    """An interlaced (Adam7) 8-bit gray PNG; Pillow writes none."""
    arr = np.asarray(im.convert("L"))
    h, w = arr.shape
    raw = b""
    for x0, y0, dx, dy in [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
                           (0, 1, 1, 2)]:
        sub = arr[y0::dy, x0::dx]
        if sub.size:
            raw += b"".join(b"\0" + row.tobytes() for row in sub)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 1)) + \
        chunk(b"IDAT", zlib.compress(raw, 1)) + chunk(b"IEND", b"")


W, H = 2400, 1600
CASES = {
    "jpeg-baseline-420": lambda im: encode(im, "JPEG", quality=90),
    "jpeg-baseline-444": lambda im: encode(im, "JPEG", quality=90, subsampling=0),
    "jpeg-progressive-420": lambda im: encode(im, "JPEG", quality=90, progressive=True),
    "jpeg-progressive-444": lambda im: encode(im, "JPEG", quality=90, progressive=True, subsampling=0),
    "jpeg-gray-progressive": lambda im: encode(im.convert("L"), "JPEG", quality=90, progressive=True),
    "jpeg-cmyk": lambda im: encode(im.convert("CMYK"), "JPEG", quality=90),
    "png-rgb": lambda im: encode(im, "PNG", compress_level=1),
    "png-rgba-16bit": png16_rgba,
    "png-palette": lambda im: encode(im.convert("P"), "PNG"),
    "png-gray-interlaced": png_gray_adam7,
    "webp-lossy": lambda im: encode(im, "WEBP", quality=80),
    "webp-lossy-alpha": lambda im: encode(im.convert("RGBA"), "WEBP", quality=80),
    "webp-lossless": lambda im: encode(im, "WEBP", lossless=True, method=0),
    "webp-animated": lambda im: encode(im, "WEBP", save_all=True, append_images=[im.rotate(180)], quality=80),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_decode_holds_no_more_than_it_took_from_the_budget(tmp_path, case):
    if not TOOL.is_file():
        pytest.fail(f"{TOOL} is missing: build it with `cargo build --release -p ringfeed-decode --examples`")
    data = CASES[case](photo(W, H))
    src = tmp_path / "img"
    src.write_bytes(data)
    # A whole-image crop at scale 1, and a small random one: the resize's
    # own memory is part of the bound.
    for crop in (["--scale", "1", "1", "--ratio", str(W / H), str(W / H), "--size", "224", "224"],
                 ["--size", "224", "224", "--layout", "chw"]):
        p = subprocess.run([str(TOOL), str(src), str(tmp_path / "out"), *crop, "--memory", str(64 << 30)],
                           capture_output=True, text=True, timeout=60)
        res = json.loads(p.stdout)
        assert res["ok"], res
        took, held = res["memory_bytes"], res["heap_peak_bytes"]
        print(f"\n{case}: took {took / MIB:.1f} MiB of the budget, held {held / MIB:.1f} MiB "
              f"({took / max(held, 1):.2f}x)")
        assert held <= took, f"{case}: held {held} bytes, more than the {took} it took from the budget"
        if case != "webp-lossless":
            assert took <= 3 * held + 2 * MIB, f"{case}: took {took} bytes for a decode that held {held}"
        # A lossless WebP's stream decides how many Huffman tables it makes
        # (up to 65,536 groups of five), so its bound is 640 bytes per byte
        # of stream: far above what a real photo's stream makes
        # (docs/images.md).
