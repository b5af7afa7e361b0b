"""Images into a trainer: the decode stage against the usual recipes (issue 30).

    .venv/bin/python bench/decode_bench.py [--images 2000] [--set both] [--busy-ms 0,40]
        [--bin target/release/ringfeed] [--extra-path DIR]

Generates JPEGs (the "small" set: 500x375 q90, ~100 KiB; the "imagenet" set:
80-400 KB, 300-1,500 px, ImageNet's spread) in a class tree, then delivers
every image once as (64, 3, 224, 224) uint8 with RandomResizedCrop(224) and a
horizontal flip, plus labels, to a trainer loop, by each recipe side by side:

- dataloader-pil: torch DataLoader, 2 workers, PIL decode + crop/resize/flip
  (torchvision's RandomResizedCrop parameters, Pillow's antialiased resize of
  the box: what torchvision's PIL path does);
- inproc-pil: the same work in the training process (what a ringfeed trainer
  reading bytes does today);
- spdl, dali-cpu: SPDL's and DALI's CPU pipelines, when importable (with
  --extra-path, a directory they were pip-installed to with --target);
- ringfeed: `serve --decode image`, the trainer through ringfeed.torch.Loader
  (ringfeed-2threads: with --decode-threads 2; the default leaves each rank a
  core, so 1 thread on 2 cores).

Each recipe at every --busy-ms: the trainer spends that long per step in a
busy loop on one core (a training step's CPU), the figure being images/s over
the whole epoch. Prints a markdown table. Torchvision's own decode_jpeg is not
measured when torchvision cannot be installed beside this torch.
"""
import argparse
import io
import math
import os
import random
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
B = 64
SIZE = 224


def make_set(root, kind, n):
    from PIL import Image

    rng = np.random.default_rng(11)
    classes = 10
    for c in range(classes):
        (root / ("c%02d" % c)).mkdir(parents=True, exist_ok=True)
    total = 0
    for i in range(n):
        if kind == "small":
            w, h, q = 500, 375, 90
        else:
            w = int(rng.integers(300, 1501))
            h = int(w * rng.uniform(0.6, 1.0))
            q = int(rng.integers(75, 96))
        # Smooth colour fields with noise: photo-like sizes.
        y, x = np.mgrid[0:h, 0:w].astype(np.float32)
        base = np.stack([np.sin(x / rng.uniform(5, 40)) * 90, np.cos(y / rng.uniform(5, 40)) * 90,
                         np.sin((x + y) / rng.uniform(5, 40)) * 90], axis=-1) + 128
        img = np.clip(base + rng.normal(0, 18, (h, w, 3)), 0, 255).astype(np.uint8)
        out = io.BytesIO()
        Image.fromarray(img).save(out, "JPEG", quality=q)
        path = root / ("c%02d" % (i % classes)) / ("%06d.jpg" % i)
        path.write_bytes(out.getvalue())
        total += len(out.getvalue())
    return total


def rrc_params(w, h, rnd):
    """torchvision RandomResizedCrop.get_params (scale 0.08-1, ratio 3/4-4/3)."""
    area = w * h
    log_ratio = (math.log(3 / 4), math.log(4 / 3))
    for _ in range(10):
        target = area * rnd.uniform(0.08, 1.0)
        ratio = math.exp(rnd.uniform(*log_ratio))
        cw = int(round(math.sqrt(target * ratio)))
        ch = int(round(math.sqrt(target / ratio)))
        if 0 < cw <= w and 0 < ch <= h:
            return rnd.randint(0, w - cw), rnd.randint(0, h - ch), cw, ch
    in_ratio = w / h
    if in_ratio < 3 / 4:
        cw, ch = w, int(round(w / (3 / 4)))
    elif in_ratio > 4 / 3:
        ch, cw = h, int(round(h * (4 / 3)))
    else:
        cw, ch = w, h
    return (w - cw) // 2, (h - ch) // 2, cw, ch


def pil_sample(path, rnd):
    from PIL import Image

    with Image.open(path) as img:
        img = img.convert("RGB")
        x, y, cw, ch = rrc_params(img.width, img.height, rnd)
        out = img.resize((SIZE, SIZE), Image.BILINEAR, box=(x, y, x + cw, y + ch))
        if rnd.random() < 0.5:
            out = out.transpose(Image.FLIP_LEFT_RIGHT)
        return np.asarray(out).transpose(2, 0, 1)


class PilDataset:
    def __init__(self, files):
        self.files = files

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        import torch

        path, label = self.files[i]
        rnd = random.Random(i)
        return torch.from_numpy(np.ascontiguousarray(pil_sample(path, rnd))), label


def files_of(root):
    classes = sorted(p.name for p in root.iterdir())
    return [(str(p), classes.index(p.parent.name)) for p in sorted(root.rglob("*.jpg"))]


def busy(ms):
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


def train_loop(batches, busy_ms):
    """Consumes (images, labels) batches; returns the images seen."""
    n = 0
    for images, labels in batches:
        assert images.shape[1:] == (3, SIZE, SIZE), images.shape
        n += images.shape[0]
        busy(busy_ms)
        del images, labels
    return n


def run_dataloader(root, busy_ms):
    import torch

    ds = PilDataset(files_of(root))
    loader = torch.utils.data.DataLoader(ds, batch_size=B, num_workers=2, shuffle=True, drop_last=True,
                                         persistent_workers=False, prefetch_factor=4)
    return train_loop(loader, busy_ms)


def run_inproc(root, busy_ms):
    import torch

    files = files_of(root)
    order = np.random.default_rng(0).permutation(len(files))

    def batches():
        rnd = random.Random(0)
        for s in range(len(files) // B):
            picked = [files[j] for j in order[s * B:(s + 1) * B]]
            images = torch.from_numpy(np.stack([pil_sample(p, rnd) for p, _ in picked]))
            yield images, torch.tensor([label for _, label in picked])

    return train_loop(batches(), busy_ms)


def run_ringfeed(root, busy_ms, binary, threads=None):
    sys.path.insert(0, str(ROOT / "bindings" / "python"))
    os.environ.setdefault("RINGFEED_LIB", str(Path(binary).parent / "libringfeed.so"))
    import ringfeed
    import ringfeed.torch

    name = "decode-bench-%s" % uuid.uuid4().hex[:8]
    serve = subprocess.Popen([binary, "serve", "--source", str(root), "--name", name, "--batch-size", str(B),
                              "--manifest-cache", "off", "--decode", "image", "--crop", "random-resized:224", "--flip"]
                             + (["--decode-threads", str(threads)] if threads else []),
                             stderr=subprocess.PIPE, text=True)
    try:
        n = train_loop(ringfeed.torch.Loader(ringfeed.attach(name, 0, timeout=60)), busy_ms)
        _, err = serve.communicate(timeout=120)
        threads = next((line for line in err.splitlines() if "decoding images" in line), "")
        return n, threads
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()


def run_spdl(root, busy_ms):
    """SPDL (FFmpeg underneath): each image loaded with a crop/scale/flip
    filter graph, 2 threads (its decoding releases the GIL), batches of B."""
    from concurrent.futures import ThreadPoolExecutor

    import spdl.io
    import torch
    from PIL import Image

    files = files_of(root)
    order = np.random.default_rng(0).permutation(len(files))

    def one(j):
        path, label = files[j]
        rnd = random.Random(int(j))
        with Image.open(path) as img:  # the header only, for the crop box
            w, h = img.size
        x, y, cw, ch = rrc_params(w, h, rnd)
        flip = ",hflip" if rnd.random() < 0.5 else ""
        buf = spdl.io.load_image(path, filter_desc="crop=%d:%d:%d:%d,scale=%d:%d%s,format=rgb24" % (
            cw, ch, x, y, SIZE, SIZE, flip))
        return spdl.io.to_numpy(buf).transpose(2, 0, 1), label

    def batches():
        with ThreadPoolExecutor(2) as pool:
            for s in range(len(files) // B):
                done = list(pool.map(one, order[s * B:(s + 1) * B]))
                yield torch.from_numpy(np.stack([d[0] for d in done])), torch.tensor([d[1] for d in done])

    return train_loop(batches(), busy_ms)


def run_dali(root, busy_ms):
    from nvidia.dali import fn, pipeline_def, types
    import torch

    @pipeline_def(batch_size=B, num_threads=2, device_id=None)
    def pipe():
        jpegs, labels = fn.readers.file(file_root=str(root), random_shuffle=True, name="r")
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                              random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3])
        images = fn.resize(images, resize_x=SIZE, resize_y=SIZE, antialias=True)
        images = fn.flip(images, horizontal=fn.random.coin_flip())
        images = fn.transpose(images, perm=[2, 0, 1])
        return images, labels

    p = pipe()
    p.build()
    total = p.epoch_size("r") // B

    def batches():
        for _ in range(total):
            images, labels = p.run()
            yield torch.from_numpy(images.as_array()), torch.from_numpy(labels.as_array())

    return train_loop(batches(), busy_ms)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--set", default="both", choices=["small", "imagenet", "both"])
    ap.add_argument("--busy-ms", default="0,40")
    ap.add_argument("--bin", default=str(ROOT / "target" / "release" / "ringfeed"))
    ap.add_argument("--extra-path", default=None)
    ap.add_argument("--only", default="dataloader-pil,inproc-pil,dali-cpu,spdl,ringfeed,ringfeed-2threads")
    a = ap.parse_args()
    if a.extra_path:
        sys.path.append(a.extra_path)
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="decode-bench-"))
    sets = ["small", "imagenet"] if a.set == "both" else [a.set]
    print("| set | recipe | trainer busy ms/step | images/s | note |")
    print("|---|---|---|---|---|")
    for kind in sets:
        root = tmp / kind
        total = make_set(root, kind, a.images)
        note_set = "%d JPEGs, %.0f KiB mean" % (a.images, total / a.images / 1024)
        for busy_ms in [float(x) for x in a.busy_ms.split(",")]:
            for recipe in a.only.split(","):
                t = time.perf_counter()
                note = note_set
                try:
                    if recipe == "dataloader-pil":
                        n = run_dataloader(root, busy_ms)
                    elif recipe == "inproc-pil":
                        n = run_inproc(root, busy_ms)
                    elif recipe in ("ringfeed", "ringfeed-2threads"):
                        n, threads = run_ringfeed(root, busy_ms, a.bin, 2 if recipe.endswith("2threads") else None)
                        note += "; " + threads.replace("ringfeed: ", "")
                    elif recipe == "dali-cpu":
                        n = run_dali(root, busy_ms)
                    elif recipe == "spdl":
                        n = run_spdl(root, busy_ms)
                    else:
                        raise SystemExit("unknown recipe %s" % recipe)
                except Exception as e:  # noqa: BLE001 - a recipe that cannot run says why
                    print("| %s | %s | %g | - | did not run: %s |" % (kind, recipe, busy_ms, str(e).splitlines()[0][:160]),
                          flush=True)
                    continue
                secs = time.perf_counter() - t
                print("| %s | %s | %g | %.0f | %s |" % (kind, recipe, busy_ms, n / secs, note), flush=True)


if __name__ == "__main__":
    main()
