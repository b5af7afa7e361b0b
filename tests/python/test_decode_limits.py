"""The decode stage's memory and time, bounded by what the ring promises
(issue 36, items 7-10), end to end through `ringfeed serve`: hostile images
in a tree, a trainer reading every batch, the loader's peak resident memory
read from /proc/PID/status (VmHWM) while it still runs.

Each test failed on the loader before the fix (RINGFEED_BIN=/work/base-bin/...):
a 1x1 PNG whose ICC profile inflates to 700 MB took 2.7 GB over 4 threads; a
1x1 WebP canvas around a 16383x8000 frame took 822 MB and 18 s; a 38-byte
lossless 9000x9000 WebP took 2.2 GB over 4 threads; --max-pixels past the
budget was taken and the allocation aborted the process; SIGTERM waited for
a batch of large progressive JPEGs (seconds) and published it."""

import base64
import io
import os
import resource
import signal
import struct
import subprocess
import threading
import time
import uuid
import zlib

import numpy as np
import pytest

import ringfeed
from e2e_util import kill_survivors, ringfeed_bin

PIL = pytest.importorskip("PIL.Image")

MIB = 1 << 20
BUDGET = 256 * MIB  # the stage's default --decode-memory
# What the loader holds besides its decodes (code, runtime, the reader's
# buffers), measured at about 20 MiB; the ring's pages are added per test.
BASE = 64 * MIB


def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def iccp_bomb_png(inflated_mib=700):
    """A 1x1 RGB PNG whose iCCP chunk inflates to INFLATED_MIB of zeros (~1 KB
    per MiB), issue 36's chunk bomb."""
    z = zlib.compressobj(9)
    block = bytes(MIB)
    icc = b"".join(z.compress(block) for _ in range(inflated_mib)) + z.flush()
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)) + \
        chunk(b"iCCP", b"icc\0\0" + icc) + chunk(b"IDAT", zlib.compress(b"\0\x10\x20\x30")) + chunk(b"IEND", b"")


# Pillow's lossless WebP of a 9000x9000 image of one colour: 38 bytes that
# decode to 81 Mpx (issue 36: 563 MB per thread).
LOSSLESS_9000 = bytes.fromhex("524946461e000000574542505650384c110000002f27e3c9080750e42ad4a3ff8188e87f0000")

# The VP8 stream (346 KB) of Pillow's lossy WebP of a 16383x8000 image of
# one colour, zlib-compressed and base64-encoded: a real key frame, made by
# Image.new("RGB", (16383, 8000), (10, 200, 30)).save(f, "WEBP", quality=50, method=0).
BIG_VP8_Z = (
    "eNrtyb0rxAEAxvGjiDIo6sJweQlRh/sDuEJJSrJdNgYUg0VKMXmbmEyXc5NspKQohqvTTVJmikJKXWcwnJ/NYjEYP8O356lP"
    "9/VBsqQj6ItHem+mj8bbW1vSqYqSUH3lzPzD4ltNKlEWBPeRy+biRyFemp1+jRVyt10jF8b827ycLHWuDkn6Y+HaaHhuOHl8"
    "3pbbGfhcaN+LDtY8ZdPLZ7Wju02b+cex3okthBBCCCGEEEIIIYQQQgghhBBCCCGEEEIIIYQQQgghhBBCCCGEEEIIIYQQQggh"
    "hBBCCCGEEEIIIYQQQgghhBBCCCGEEEIIIYQQQgghhBBCCCGEEEIIIYQQQgghhBBCCCGEEEIIIYQQQgghhBBCCCGEEEIIIYQQ"
    "QgghhBBCCCGEEEIIIYQQQgghhBBCCCGEEEIIIYQQQgghhBBCCCGEEEIIIYQQQgghhBBCCCGEEEIIIYQQQgghhBBCCCGEEEII"
    "IYQQQgghhBBCCCGEEEIIIYQQQgghhBBCCCGEEEIIIYQQQgghhBBCCCGEEEIIIYQQQgghhBBCCCGEEEIIIYQQQgghhBBCCCGE"
    "EEIIIYQQQgghhBBCCCGEEEIIIYQQQgghhBBCCCGEEEIIIYQQQgghhBBCCCGEEEIIIYQQQgghhBBCCCGEEEIIIYQQQgghhBBC"
    "CCGEEEIIIYQQQgghhBBCCCGEEEIIIYQQQgghhBBCCCGEEEIIIYQQQgghhBBCCCGEEEIIIYQQQgghhBBCCCGEEEIIIYQQQggh"
    "hBBCCCGEEEIIIYQQQgghhBBCCCGEEEIIIYQQQgghhBBCCCGEEEIIIYQQQgghhBBCCCGEEEIIIYQQQgghhBBCCCGEEEIIIYQQ"
    "QgghhBBCCCGEEEIIIYQQQgghhBBCCCGEEEIIIYQQQgghhBBCCCGEEEIIIYQQQgghhBBCCCGEEEIIIYQQQgghhBBCCCGEEEII"
    "IYQQQgghhBBCCCGEEEIIIYQQQgghhBBCCCGEEEIIIYQQQgghhBBCCCGEEEIIIYQQQgghhBBCCCGEEEIIIYQQQgghhBBCCCGE"
    "EEIIIYQQQgghhBBCCCGEEEIIIYQQQgghhBBCCCGEEEIIIYQQQgghhBBCCCGEEEIIIYQQQgghhBBCCCGEEEIIIYQQQgghhBBC"
    "CCGEEEIIIYQQQgghhBBCCCGEEEIIIYQQQgghhBBCCCGEEEIIIYQQQgghhBBCCCGEEEIIIYQQQgghhBBCCCGEEEIIIYQQQggh"
    "hBBCCCGEEEIIIYQQQgghhBBCCCGEEEIIIYQQQgghhBBCCCGEEEIIIYQQQgghhBBCCCGEEEIIIYQQQgghhBBCCCGEEELoh65C"
    "oa/i6UpxdmryORMEmf279UTDzOF7eX/jdnYqVle15vw6PfmN6tA31rT/YQ=="
)


def big_vp8():
    return zlib.decompress(base64.b64decode("".join(BIG_VP8_Z)))


def riff_chunk(kind, payload):
    return kind + struct.pack("<I", len(payload)) + payload + (b"\0" if len(payload) % 2 else b"")


def frame_over_canvas_webp():
    """A VP8X canvas of 1x1 around the 16383x8000 frame (issue 36, item 8)."""
    vp8x = riff_chunk(b"VP8X", bytes(4) + (0).to_bytes(3, "little") + (0).to_bytes(3, "little"))
    body = b"WEBP" + vp8x + riff_chunk(b"VP8 ", big_vp8())
    return b"RIFF" + struct.pack("<I", len(body)) + body


def status(pid, field):
    """A /proc/PID/status figure in bytes (VmHWM: the peak resident set)."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no %s in /proc/%d/status" % (field, pid))


def serve_and_read(root, *flags, preexec_fn=None, timeout=120):
    """Serves ROOT's images and reads every batch on rank 0. Returns (the
    loader's peak resident bytes, read before the last batch is released,
    its ring's bytes, [bad flags per sample], seconds, exit code, stderr)."""
    loader_name = "lim-%s" % uuid.uuid4().hex[:8]
    start = time.monotonic()
    loader = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", str(root), "--name", loader_name, "--manifest-cache", "off",
         "--no-shuffle", "--decode", "image", "--crop", "random-resized:32", "--on-bad-sample", "zero", *flags],
        stderr=subprocess.PIPE, text=True, preexec_fn=preexec_fn)
    peak, ring, bad = 0, 0, []
    try:
        with ringfeed.attach(loader_name, 0, timeout=60) as feed:
            ring = os.stat("/dev/shm/ringfeed-" + loader_name).st_size
            for batch in feed:
                bad += [bool(b) for b in batch.bad]
                # The loader holds every byte it ever will by now.
                peak = status(loader.pid, "VmHWM")
                batch.release()
        _, err = loader.communicate(timeout=timeout)
    finally:
        kill_survivors([loader])
    return peak, ring, bad, time.monotonic() - start, loader.returncode, err


def write_copies(root, name, data, copies):
    os.makedirs(root / "a", exist_ok=True)
    for i in range(copies):
        (root / "a" / ("%02d-%s" % (i, name))).write_bytes(data)


def test_a_png_chunk_bomb_takes_no_memory_and_is_served_as_the_image_it_is(tmp_path):
    # Issue 36, item 7: 8 such PNGs on 4 threads reached 2.5 GB.
    write_copies(tmp_path, "bomb.png", iccp_bomb_png(), 8)
    peak, ring, bad, _, rc, err = serve_and_read(tmp_path, "--batch-size", "4", "--decode-threads", "4")
    print("\nICC bomb x8, 4 threads: peak RSS %.0f MiB (ring %.1f MiB)" % (peak / MIB, ring / MIB))
    assert rc == 0, err
    assert bad == [False] * 8, "the 1x1 image is fine; its unused ICC profile is skipped"
    assert peak < BASE + ring, "peak RSS %.0f MiB for 1x1 images" % (peak / MIB)


def test_a_webp_frame_larger_than_its_canvas_is_refused_before_it_is_decoded(tmp_path):
    # Item 8: a 1x1 VP8X canvas around a 16383x8000 frame passed
    # --max-pixels 1000000 and was decoded (212 MB, seconds) per thread.
    write_copies(tmp_path, "frame.webp", frame_over_canvas_webp(), 4)
    peak, ring, bad, took, rc, err = serve_and_read(
        tmp_path, "--batch-size", "4", "--decode-threads", "4", "--max-pixels", "1000000")
    print("\nframe over canvas x4: peak RSS %.0f MiB, %.2f s" % (peak / MIB, took))
    assert rc == 0, err
    assert bad == [True] * 4
    assert peak < BASE + ring, "peak RSS %.0f MiB: a frame was decoded" % (peak / MIB)


def test_every_decode_thread_shares_one_memory_budget(tmp_path):
    # Item 7/8: a 38-byte lossless 9000x9000 WebP took 563 MB per thread
    # (2.2 GB on 4): its decode needs more than the whole budget, so it is a
    # bad sample refused from its header; and large JPEGs on 4 threads hold
    # at most the budget between them.
    write_copies(tmp_path, "l9000.webp", LOSSLESS_9000, 4)
    # 16 Mpx progressive 4:2:0 JPEGs: about 100 MiB each to decode (RGB,
    # whole-image coefficients), 4 at once would be 400 MiB.
    rng = np.random.default_rng(0)
    h, w = 3300, 4900
    y = np.linspace(0, 255, h, dtype=np.float32)[:, None]
    x = np.linspace(0, 255, w, dtype=np.float32)[None, :]
    img = np.stack(np.broadcast_arrays((y + x) / 2, y, x), -1) + rng.normal(0, 8, (h, w, 3)).astype(np.float32)
    out = io.BytesIO()
    PIL.fromarray(img.clip(0, 255).astype(np.uint8)).save(out, "JPEG", quality=80, progressive=True)
    write_copies(tmp_path, "big.jpg", out.getvalue(), 4)
    peak, ring, bad, _, rc, err = serve_and_read(tmp_path, "--batch-size", "4", "--decode-threads", "4")
    print("\nbudget: peak RSS %.0f MiB (ring %.1f MiB); bad %s" % (peak / MIB, ring / MIB, bad))
    assert rc == 0, err
    assert peak < BUDGET + BASE + ring, "peak RSS %.0f MiB over the budget" % (peak / MIB)
    # Key order: 00-big.jpg, 00-l9000.webp, 01-big.jpg, ...
    assert bad == [False, True] * 4, bad


def test_max_pixels_past_the_budget_is_refused_at_start_not_aborted_on(tmp_path):
    # Item 9: --max-pixels 4300000000 was taken, and a 65535x65535 PNG header
    # then asked for 12.9 GB: the allocation aborted the loader (SIGABRT, no
    # outcome). Under a 4 GiB address space limit so the allocation fails
    # here too, whatever the machine's overcommit.
    write_copies(tmp_path, "huge.png", b"\x89PNG\r\n\x1a\n" + chunk(
        b"IHDR", struct.pack(">IIBBBBB", 65535, 65535, 8, 2, 0, 0, 0)) + chunk(b"IDAT", b"x"), 1)

    def limit():
        cap = 4 << 30
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    out = subprocess.run(
        [ringfeed_bin(), "serve", "--source", str(tmp_path), "--name", "lim-%s" % uuid.uuid4().hex[:8],
         "--manifest-cache", "off", "--batch-size", "1", "--decode", "image", "--on-bad-sample", "zero",
         "--max-pixels", "4300000000"],
        capture_output=True, text=True, timeout=60, preexec_fn=limit)
    assert out.returncode == 1, (out.returncode, out.stderr)
    assert "--max-pixels 4300000000 is more than the decode memory budget holds" in out.stderr, out.stderr
    assert "--decode-memory" in out.stderr, out.stderr


def test_an_allocation_that_fails_is_a_bad_sample_not_an_abort(tmp_path):
    # Item 9, with a budget that lets the 12.9 GB through: the allocation
    # fails (4 GiB address space) and the sample is a flagged zero image.
    write_copies(tmp_path, "huge.png", b"\x89PNG\r\n\x1a\n" + chunk(
        b"IHDR", struct.pack(">IIBBBBB", 65535, 65535, 8, 2, 0, 0, 0)) + chunk(b"IDAT", b"x"), 1)
    good = io.BytesIO()
    PIL.new("RGB", (64, 48), (1, 2, 3)).save(good, "PNG")
    write_copies(tmp_path, "ok.png", good.getvalue(), 1)

    def limit():
        cap = 4 << 30
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    _, _, bad, _, rc, err = serve_and_read(
        tmp_path, "--batch-size", "1", "--decode-memory", "64GiB", "--max-pixels", "4300000000", preexec_fn=limit)
    assert rc == 0, err
    assert bad == [True, False], bad
    assert "decoded 2 images (1 could not be decoded" in err, err


def progressive_jpeg(w, h):
    rng = np.random.default_rng(1)
    y = np.linspace(0, 255, h, dtype=np.float32)[:, None]
    x = np.linspace(0, 255, w, dtype=np.float32)[None, :]
    img = np.stack(np.broadcast_arrays(x, y, (x + y) / 2), -1) + rng.normal(0, 12, (h, w, 3)).astype(np.float32)
    out = io.BytesIO()
    PIL.fromarray(img.clip(0, 255).astype(np.uint8)).save(out, "JPEG", quality=90, progressive=True)
    return out.getvalue()


def test_sigterm_stops_the_loader_within_a_second_and_abandons_the_batch(tmp_path):
    # Item 10: with 12 progressive 81 Mpx JPEGs in a batch and one decode
    # thread, the loader exited 15-18 s after SIGTERM and published the
    # batch. Here 12 of 30 Mpx (within the default memory budget), about
    # 0.3-1 s each to decode.
    write_copies(tmp_path, "big.jpg", progressive_jpeg(6000, 5000), 12)
    loader_name = "lim-%s" % uuid.uuid4().hex[:8]
    loader = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", str(tmp_path), "--name", loader_name, "--manifest-cache", "off",
         "--batch-size", "12", "--decode", "image", "--decode-threads", "1"],
        stderr=subprocess.PIPE, text=True)
    got, errors = [], []
    try:
        feed = ringfeed.attach(loader_name, 0, timeout=60)

        def take():
            try:
                got.append(feed.next(timeout=60))
            except Exception as e:  # noqa: BLE001 - the stop's error is the expected outcome
                errors.append(e)

        reader = threading.Thread(target=take)
        reader.start()
        # The reads of 12 files from the page cache take milliseconds; the
        # decodes of the batch, seconds: stop in the middle of them.
        time.sleep(1.5)
        assert loader.poll() is None, loader.stderr.read()
        sent = time.monotonic()
        loader.send_signal(signal.SIGTERM)
        loader.wait(timeout=60)
        took = time.monotonic() - sent
        reader.join(30)
        _, err = loader.communicate(timeout=10)
        feed.close()
    finally:
        kill_survivors([loader])
    print("\nSIGTERM mid-batch: the loader exited %.2f s after it" % took)
    assert took < 1.0, "the loader exited %.2f s after SIGTERM" % took
    assert not got, "the batch being decoded was published"
    assert errors and "signal 15" in str(errors[0]), errors
    assert loader.returncode != 0, err
