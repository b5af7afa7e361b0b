"""µs per image of the decode stage against Pillow doing the same work
(docs/images.md): decode to RGB + RandomResizedCrop(224) + horizontal flip, one
thread, on one JPEG (default: a generated 500x375 photo-like image, quality
90). Rounds alternate between the two so that a busy machine slows both alike;
the best round of each is printed, in CPU time (user + system: on a shared
machine, less noisy than wall time; the tool's start and file read are in
its figure).

    cargo build --release -p ringfeed-decode --examples
    python bench/decode_vs_pillow.py [IMAGE] [--n 300] [--rounds 5]
"""

import argparse
import io
import json
import math
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from PIL import Image

REPO = Path(__file__).resolve().parents[1]
TOOL = REPO / "target" / "release" / "examples" / "decode_file"


def make_jpeg(path):
    sys.path.insert(0, str(REPO / "tests" / "python"))
    from test_decode_pixels import photo  # the pixel tests' generator

    photo().save(path, "JPEG", quality=90)


def rrc_box(width, height):
    area = width * height
    for _ in range(10):
        target = area * random.uniform(0.08, 1.0)
        aspect = math.exp(random.uniform(math.log(3 / 4), math.log(4 / 3)))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            x, y = random.randint(0, width - w), random.randint(0, height - h)
            return x, y, x + w, y + h
    return 0, 0, width, height


def pillow_us(data, n, decode_only):
    t = time.process_time()
    for _ in range(n):
        im = Image.open(io.BytesIO(data)).convert("RGB")
        if not decode_only:
            im = im.crop(rrc_box(*im.size)).resize((224, 224), Image.BILINEAR)
            if random.random() < 0.5:
                im = im.transpose(Image.FLIP_LEFT_RIGHT)
            im.tobytes()
    return (time.process_time() - t) / n * 1e6


def ours_us(path, n):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.NamedTemporaryFile() as out:
        subprocess.run([str(TOOL), str(path), out.name, "--flip", "--layout", "chw", "--repeat", str(n)],
                       capture_output=True, text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu / n * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("image", nargs="?")
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        path = Path(a.image or Path(d) / "photo.jpg")
        if not a.image:
            make_jpeg(path)
        data = path.read_bytes()
        best = {"pillow decode": math.inf, "pillow decode+crop+resize+flip": math.inf, "ringfeed-decode stage": math.inf}
        for _ in range(a.rounds):
            best["pillow decode"] = min(best["pillow decode"], pillow_us(data, a.n, True))
            best["pillow decode+crop+resize+flip"] = min(best["pillow decode+crop+resize+flip"], pillow_us(data, a.n, False))
            best["ringfeed-decode stage"] = min(best["ringfeed-decode stage"], ours_us(path, a.n))
        print(f"{path.name}: {len(data)} bytes, {Image.open(path).size}, best of {a.rounds} rounds of {a.n}")
        for k, v in best.items():
            print(f"  {k:34s} {v:8.0f} µs/image")


if __name__ == "__main__":
    main()
