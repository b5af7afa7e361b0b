"""The decode stage's pixels against Pillow's (issue 30, acceptance 3 and 4).

Images are generated here with Pillow, decoded by the decode stage's test tool
(engine/decode/examples/decode_file.rs: `cargo build --release -p
ringfeed-decode --examples`; $RINGFEED_DECODE_FILE overrides its path), and
compared with Pillow on the same crop box:
- at scale 1 (a crop, no resize): JPEG within 4 per channel and within 2 on
  all but 0.1% of samples (decoders round differently), PNG and WebP exact;
- RandomResizedCrop(224) + flip: Pillow's crop then BILINEAR resize
  (antialiased, as torchvision's antialias=True), PSNR floor asserted;
- the crop boxes against a Python copy of docs/images.md's algorithm;
- a corpus of bad inputs: each its error kind, or its right pixels, in bounded
  time and memory, never a crash.
Run with -s to see the figures quoted in docs/images.md.
"""

import io
import json
import math
import os
import resource
import struct
import subprocess
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

REPO = Path(__file__).resolve().parents[2]
TOOL = Path(os.environ.get("RINGFEED_DECODE_FILE", REPO / "target" / "release" / "examples" / "decode_file"))
W, H = 500, 375


@pytest.fixture(scope="module")
def tool():
    if not TOOL.is_file():
        pytest.fail(f"{TOOL} is missing: build it with `cargo build --release -p ringfeed-decode --examples`")
    return TOOL


def photo(w=W, h=H, seed=0):
    """A photo-like RGB image: smooth structure, edges and sensor noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 128 + 100 * np.sin(x / 37 + y / 53)
    g = 128 + 90 * np.cos(x / 29 - y / 41) * (x > w / 3)
    b = 60 + 150 * ((x - w / 2) ** 2 + (y - h / 2) ** 2 < (h / 3) ** 2)
    arr = np.stack([r, g, b], -1) + rng.normal(0, 6, (h, w, 3))
    return Image.fromarray(arr.clip(0, 255).astype(np.uint8))


def encode(im, fmt, **kw):
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


def png16(arr):
    """A 16-bit RGB PNG of a (h, w, 3) uint16 array (Pillow cannot write one)."""
    h, w, _ = arr.shape
    raw = b"".join(b"\0" + arr[y].astype(">u2").tobytes() for y in range(h))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0)) + \
        chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def run(tool, tmp_path, data, *args, name="img", limit_mib=None):
    """Runs decode_file on `data`; with `limit_mib`, under that much address
    space (RLIMIT_AS): an allocation past it fails, so the run is proof of
    bounded memory. (A child's ru_maxrss would not do: Linux keeps the
    forked test process's high-water mark across exec.)"""
    src, out = tmp_path / name, tmp_path / (name + ".raw")
    src.write_bytes(data)

    def limit():
        cap = limit_mib << 20
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    t = time.monotonic()
    p = subprocess.run([str(tool), str(src), str(out), *map(str, args)], capture_output=True, text=True, timeout=30,
                       preexec_fn=limit if limit_mib else None)
    took = time.monotonic() - t
    assert p.returncode in (0, 1), f"decode_file exited {p.returncode}: {p.stderr}"
    res = json.loads(p.stdout)
    res["seconds"] = took
    if res["ok"]:
        res["pixels"] = np.frombuffer(out.read_bytes(), np.uint8)
    return res


def pil_rgb(data):
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def psnr(a, b):
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return math.inf if mse == 0 else 10 * math.log10(255**2 / mse)


# (encoder, max abs difference from Pillow at scale 1, share of samples that
# may differ by more than 2). JPEG: zune-jpeg's IDCT and chroma upsampling
# round differently from libjpeg-turbo's (Pillow): measured max 3 (4:4:4,
# gray, CMYK) and 4 at sharp colour edges of 4:2:0/4:2:2 chroma, on 0.04% of
# the samples (jpeg-decoder measured no better; docs/images.md). PNG and
# lossless WebP: exact. Lossy WebP: image-webp matched libwebp exactly here.
JPEG_MAX, JPEG_SHARE = 4, 0.001
CASES = {
    "jpeg-baseline": (lambda im: encode(im, "JPEG", quality=90), JPEG_MAX, JPEG_SHARE),
    "jpeg-progressive": (lambda im: encode(im, "JPEG", quality=90, progressive=True), JPEG_MAX, JPEG_SHARE),
    "jpeg-gray": (lambda im: encode(im.convert("L"), "JPEG", quality=90), JPEG_MAX, JPEG_SHARE),
    "jpeg-cmyk": (lambda im: encode(im.convert("CMYK"), "JPEG", quality=90), JPEG_MAX, JPEG_SHARE),
    "jpeg-444": (lambda im: encode(im, "JPEG", quality=95, subsampling=0), JPEG_MAX, JPEG_SHARE),
    "png-rgb": (lambda im: encode(im, "PNG"), 0, 0),
    "png-palette": (lambda im: encode(im.convert("P"), "PNG"), 0, 0),
    "png-alpha": (lambda im: encode(im.convert("RGBA"), "PNG"), 0, 0),
    "png-gray": (lambda im: encode(im.convert("L"), "PNG"), 0, 0),
    "png-16bit": (lambda im: png16(np.asarray(im).astype(np.uint16) * 257 + 3), 0, 0),
    "webp-lossless": (lambda im: encode(im, "WEBP", lossless=True), 0, 0),
    "webp-lossy": (lambda im: encode(im, "WEBP", quality=90), 2, 0),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_crop_at_scale_one_matches_pillow_within_the_formats_bound(tool, tmp_path, case):
    make, bound, share_over_2 = CASES[case]
    data = make(photo())
    ref = pil_rgb(data)
    # Resize(375) of a 500x375 image is the identity; CenterCrop(300, 320)
    # is then a plain crop at left 90, top 38 (torchvision's rounding).
    res = run(tool, tmp_path, data, "--crop", "center", "--resize", 375, "--size", 300, 320)
    assert res["ok"], res
    assert (res["crop"]["x"], res["crop"]["y"], res["crop"]["resized"]) == (90, 38, [W, H])
    got = res["pixels"].reshape(300, 320, 3)
    want = ref[38:338, 90:410]
    diff = np.abs(got.astype(int) - want.astype(int))
    over_2 = float(np.mean(diff > 2))
    print(f"\n{case}: scale 1 max abs diff {diff.max()}, mean {diff.mean():.3f}, "
          f"over 2: {over_2:.4%}, PSNR {psnr(got, want):.1f} dB")
    assert diff.max() <= bound, f"{case}: max abs diff {diff.max()} > {bound}"
    assert over_2 <= share_over_2, f"{case}: {over_2:.4%} of samples differ by more than 2"


@pytest.mark.parametrize("case", sorted(CASES))
def test_random_resized_crop_and_flip_match_pillows_bilinear_resize(tool, tmp_path, case):
    make = CASES[case][0]
    data = make(photo(seed=1))
    ref = Image.fromarray(pil_rgb(data))
    worst = math.inf
    for index in range(4):
        res = run(tool, tmp_path, data, "--flip", "--seed", 11, "--index", index, "--layout", "chw")
        assert res["ok"], res
        c = res["crop"]
        want = ref.crop((c["x"], c["y"], c["x"] + c["w"], c["y"] + c["h"])).resize((224, 224), Image.BILINEAR)
        want = np.asarray(want.transpose(Image.FLIP_LEFT_RIGHT) if c["flip"] else want)
        got = res["pixels"].reshape(3, 224, 224).transpose(1, 2, 0)
        worst = min(worst, psnr(got, want))
    print(f"\n{case}: RandomResizedCrop(224)+flip vs Pillow crop+BILINEAR, worst PSNR of 4: {worst:.1f} dB")
    assert worst >= 35, f"{case}: PSNR {worst:.1f} dB under 35"


# docs/images.md's algorithm, in Python: the boxes must agree with the tool's.
MASK = (1 << 64) - 1


def mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def reference_box(seed, epoch, index, width, height, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    key = mix(mix(mix(seed ^ 0x72696E6766656564) ^ epoch) ^ index)
    draw = lambda n: mix((key + (n + 1) * 0x9E3779B97F4A7C15) & MASK)
    unit = lambda n: (draw(n) >> 11) * 2.0**-53
    below = lambda n, count: (draw(n) * count) >> 64
    flip = draw(40) >> 63 == 1
    area = width * height
    for t in range(10):
        target = area * (scale[0] + (scale[1] - scale[0]) * unit(4 * t))
        lo, hi = math.log(ratio[0]), math.log(ratio[1])
        aspect = math.exp(lo + (hi - lo) * unit(4 * t + 1))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return below(4 * t + 3, width - w + 1), below(4 * t + 2, height - h + 1), w, h, flip
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif in_ratio > ratio[1]:
        w, h = round(height * ratio[1]), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h, flip


def test_crop_boxes_follow_the_documented_algorithm(tool, tmp_path):
    for (w, h), seed, epoch, index in [((W, H), 0, 0, 0), ((W, H), 0, 0, 1), ((W, H), 7, 3, 12345),
                                       ((64, 480), 1, 1, 1), ((1000, 10), 2, 0, 5), ((33, 29), 2**63, 9, 2**40)]:
        data = encode(photo(w, h), "PNG")
        res = run(tool, tmp_path, data, "--flip", "--seed", seed, "--epoch", epoch, "--index", index)
        c = res["crop"]
        assert (c["x"], c["y"], c["w"], c["h"], c["flip"]) == reference_box(seed, epoch, index, w, h)


def bomb_png(side=30_000):
    """A PNG whose header claims side x side RGB: a real zlib stream of its first 64 rows, cut there."""
    row = b"\0" + bytes(side * 3)
    z = zlib.compressobj(9)
    idat = z.compress(row * 64) + z.flush(zlib.Z_SYNC_FLUSH)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)) + \
        chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def test_bad_inputs_give_their_error_kind_in_bounded_time_and_memory(tool, tmp_path):
    jpeg = encode(photo(), "JPEG", quality=90)
    sof = jpeg.index(b"\xff\xc0")
    corrupt_marker = jpeg[:sof] + b"\xff\x01" + jpeg[sof + 2:]
    bomb = bomb_png()
    assert len(bomb) < 16_384, len(bomb)
    corpus = {
        "truncated.jpg": (jpeg[: len(jpeg) // 2], "Truncated"),
        "corrupt-marker.jpg": (corrupt_marker, "Corrupt"),
        "zero.jpg": (b"", "NotAnImage"),
        "text.jpg": (b"this is a text file named .jpg\n", "NotAnImage"),
        "bomb.png": (bomb, "TooManyPixels"),
        "truncated.png": (encode(photo(), "PNG")[:5000], "Truncated"),
        "truncated.webp": (encode(photo(), "WEBP", quality=90)[:3000], "Truncated"),
    }
    for name, (data, kind) in corpus.items():
        # The bomb would need 2.7 GB of pixels: every input decodes (or is
        # refused) within 512 MiB of address space.
        res = run(tool, tmp_path, data, name=name, limit_mib=512)
        print(f"\n{name}: {res.get('kind')}: {res.get('error')} ({res['seconds'] * 1000:.0f} ms)")
        assert not res["ok"] and res["kind"] == kind, (name, res)
        assert res["seconds"] < 5, (name, res["seconds"])


def test_cmyk_jpeg_and_16_bit_png_decode_to_the_right_pixels(tool, tmp_path):
    im = photo()
    whole = ("--scale", 1, 1, "--ratio", W / H, W / H, "--size", H, W)
    cmyk = encode(im.convert("CMYK"), "JPEG", quality=95)
    res = run(tool, tmp_path, cmyk, *whole)
    assert res["ok"], res
    diff = np.abs(res["pixels"].reshape(H, W, 3).astype(int) - pil_rgb(cmyk).astype(int))
    assert diff.max() <= 2, diff.max()
    arr16 = np.asarray(im).astype(np.uint16) * 257 + 100
    res = run(tool, tmp_path, png16(arr16), *whole)
    assert res["ok"], res
    assert np.array_equal(res["pixels"].reshape(H, W, 3), (arr16 >> 8).astype(np.uint8))
