"""The decode stage end to end (issue 30): `serve --decode image` over an
ImageFolder tree of JPEG, PNG and WebP files, read by trainers as images and
labels; the same pixels whatever the world size, resume point or thread
count; bad images stop the run or become flagged zero images."""

import io
import os
import subprocess
import threading
import uuid
import zlib

import numpy as np
import pytest

import ringfeed
from e2e_util import kill_survivors, ringfeed_bin

PIL = pytest.importorskip("PIL.Image")

CLASSES = ["ant", "bee", "cow"]


def _encode(i, rng):
    """Image i of the tree in one of the formats the stage reads."""
    h, w = int(rng.integers(40, 90)), int(rng.integers(40, 90))
    rgb = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    img = PIL.fromarray(rgb)
    out = io.BytesIO()
    kind = i % 6
    if kind == 0:
        img.save(out, "JPEG", quality=90)
    elif kind == 1:
        img.save(out, "JPEG", quality=80, progressive=True)
    elif kind == 2:
        img.convert("L").save(out, "JPEG")
    elif kind == 3:
        img.convert("P").save(out, "PNG")
    elif kind == 4:
        img.convert("RGBA").save(out, "PNG")
    else:
        img.save(out, "WEBP", quality=80)
    ext = ["jpg", "jpg", "jpg", "png", "png", "webp"][kind]
    return out.getvalue(), ext


def make_tree(root, per_class=72):
    rng = np.random.default_rng(7)
    for c in CLASSES:
        os.makedirs(root / c)
        for i in range(per_class):
            data, ext = _encode(i, rng)
            (root / c / ("%03d.%s" % (i, ext))).write_bytes(data)
    return len(CLASSES) * per_class


def name(what):
    return "img-%s-%s" % (what, uuid.uuid4().hex[:8])


def serve(root, loader, *flags):
    return subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", str(root), "--name", loader, "--manifest-cache", "off", "--seed", "5",
         "--decode", "image", "--crop", "random-resized:32", "--flip", *flags],
        stderr=subprocess.PIPE, text=True)


def read_all(loader, world_size, classes=len(CLASSES)):
    """{(epoch, index): (crc32 of the image, label, bad)} over every rank,
    one thread per rank."""
    seen, errors, lock = {}, [], threading.Lock()

    def rank(r):
        try:
            with ringfeed.attach(loader, r, timeout=30) as feed:
                assert feed.info.images.height == 32 and feed.info.images.chw
                assert feed.info.images.classes == classes
                for batch in feed:
                    images, labels, bad = batch.images, batch.labels, batch.bad
                    assert images.shape == (len(batch), 3, 32, 32)
                    for i, index in enumerate(batch.indices):
                        key = (batch.epoch, int(index))
                        with lock:
                            assert key not in seen, "sample delivered twice: %r" % (key,)
                            seen[key] = (zlib.crc32(images[i].tobytes()), int(labels[i]), bool(bad[i]))
                    del images, labels, bad
                    batch.release()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    return seen


def run(root, what, world_size, *flags, classes=len(CLASSES)):
    loader_name = name(what)
    loader = serve(root, loader_name, "--world-size", str(world_size), *flags)
    try:
        seen = read_all(loader_name, world_size, classes)
        _, err = loader.communicate(timeout=60)
        assert loader.returncode == 0, err
    finally:
        kill_survivors([loader])
    return seen, err


def test_images_and_labels_are_the_same_for_any_world_size_resume_point_and_thread_count(tmp_path):
    n = make_tree(tmp_path / "tree")
    a, err = run(tmp_path / "tree", "a", 1, "--batch-size", "8", "--epochs", "2", "--decode-threads", "1")
    assert "3 classes from directory names (ant … cow)" in err, err
    assert "decoded %d images (0 could not be decoded" % (2 * n) in err, err
    # Every sample once per epoch, its label the index of its directory.
    assert sorted(a) == [(e, i) for e in range(2) for i in range(n)]
    per_class = n // len(CLASSES)
    assert all(label == index // per_class for (_, index), (_, label, _) in a.items())
    # Not one image repeated: the crops differ per sample and epoch.
    assert len({crc for crc, _, _ in a.values()}) == len(a)
    # Two ranks, resumed a third of the way into epoch 0, two threads.
    b, _ = run(tmp_path / "tree", "b", 2, "--batch-size", "4", "--epochs", "2", "--resume", "0:32",
               "--decode-threads", "2")
    assert len(b) == 2 * n - 32
    assert all(a[key] == value for key, value in b.items()), "other pixels under another world size or thread count"
    # The same run again: the same pixels.
    c, _ = run(tmp_path / "tree", "c", 2, "--batch-size", "4", "--epochs", "2", "--resume", "0:32",
               "--decode-threads", "2")
    assert c == b


def test_a_center_crop_matches_pillow(tmp_path):
    root = tmp_path / "one" / "only"
    os.makedirs(root)
    rng = np.random.default_rng(3)
    # Smooth content, so that resampling differences stay small.
    y, x = np.mgrid[0:120, 0:160]
    rgb = np.stack([x * 1.5, y * 2.0, (x + y) * 0.9], axis=-1).astype(np.uint8)
    PIL.fromarray(rgb).save(root / "a.png")
    loader_name = name("center")
    loader = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", str(tmp_path / "one"), "--name", loader_name, "--manifest-cache", "off",
         "--batch-size", "1", "--decode", "image", "--crop", "center:64", "--resize", "80", "--layout", "hwc"],
        stderr=subprocess.PIPE, text=True)
    try:
        with ringfeed.attach(loader_name, 0, timeout=30) as feed:
            batch = feed.next()
            got = batch.images[0].astype(np.int16)
            batch.release()
        loader.communicate(timeout=60)
    finally:
        kill_survivors([loader])
    # torchvision's eval recipe in Pillow: the shorter side to 80, then the centre 64 x 64.
    img = PIL.fromarray(rgb).resize((107, 80), PIL.BILINEAR)
    left, top = (107 - 64) // 2, (80 - 64) // 2
    want = np.asarray(img.crop((left, top, left + 64, top + 64))).astype(np.int16)
    assert got.shape == (64, 64, 3)
    mse = float(np.mean((got - want) ** 2))
    psnr = 10 * np.log10(255 ** 2 / max(mse, 1e-9))
    assert psnr >= 30, "PSNR %.1f dB against Pillow's resize and centre crop" % psnr


def broken_corpus(tree):
    """Issue 30's corpus of bad inputs, beside the good images: five that
    cannot be decoded, and a CMYK JPEG and a 16-bit PNG that must be."""
    from test_decode_pixels import bomb_png, png16

    jpeg = (tree / "ant" / "000.jpg").read_bytes()
    sof = jpeg.index(b"\xff\xc0")
    bad = {
        "bee/zz-text.jpg": b"this is text, not a JPEG",
        "bee/zz-zero.jpg": b"",
        "cow/zz-cut.jpg": jpeg[:300],
        "cow/zz-marker.jpg": jpeg[:sof] + b"\xff\x01" + jpeg[sof + 2:],
        "cow/zz-bomb.png": bomb_png(),
    }
    for key, data in bad.items():
        (tree / key).write_bytes(data)
    rgb = np.random.default_rng(1).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    out = io.BytesIO()
    PIL.fromarray(rgb).convert("CMYK").save(out, "JPEG")
    (tree / "ant" / "zz-cmyk.jpg").write_bytes(out.getvalue())
    (tree / "ant" / "zz-16bit.png").write_bytes(png16(rgb.astype(np.uint16) * 257))
    return len(bad)


def test_a_bad_image_stops_the_run_by_default_and_is_a_flagged_zero_image_on_request(tmp_path):
    make_tree(tmp_path / "tree", per_class=4)
    bad = broken_corpus(tmp_path / "tree")
    loader_name = name("bad")
    loader = serve(tmp_path / "tree", loader_name, "--batch-size", "2", "--no-shuffle")
    try:
        with pytest.raises(ringfeed.Error, match="zz-"):
            with ringfeed.attach(loader_name, 0, timeout=30) as feed:
                for batch in feed:
                    batch.release()
        _, err = loader.communicate(timeout=60)
    finally:
        kill_survivors([loader])
    assert loader.returncode != 0
    # In key order the first bad one is bee/zz-text.jpg.
    assert "bee/zz-text.jpg) cannot be decoded: not an image" in err and "--on-bad-sample zero" in err, err
    seen, err = run(tmp_path / "tree", "zero", 1, "--batch-size", "1", "--on-bad-sample", "zero")
    flagged = sorted(index for (_, index), (_, _, flag) in seen.items() if flag)
    assert len(flagged) == bad, seen
    assert "decoded 19 images (%d could not be decoded" % bad in err, err
    zero = zlib.crc32(bytes(3 * 32 * 32))
    assert all(seen[(0, i)][0] == zero for i in flagged)
    # The CMYK JPEG and the 16-bit PNG were decoded: no good image is zero.
    assert all(crc != zero for (_, i), (crc, _, flag) in seen.items() if not flag)


@pytest.mark.parametrize("flags, says", [
    (["--crop", "center:224"], "--crop shapes the decode stage; add --decode image"),
    (["--decode", "image", "--crop", "middle:224"], "is not a crop"),
    (["--decode", "image", "--crop", "random-resized:0"], "is not N or HxW"),
    (["--decode", "image", "--resize", "300"], "--resize sizes --crop center only"),
    (["--decode", "image", "--record-bytes", "4"], "cannot be used with --record-bytes"),
    (["--image-field", "png"], "--image-field shapes the decode stage"),
    (["--decode", "image", "--labels", "dirs"], "is not inside a class directory"),
])
def test_image_flags_that_cannot_work_are_refused_before_serving(tmp_path, flags, says):
    (tmp_path / "top.jpg").write_bytes(b"x")
    out = subprocess.run([ringfeed_bin(), "serve", "--source", str(tmp_path), "--name", name("flags"),
                          "--batch-size", "1", "--manifest-cache", "off", *flags],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and says in out.stderr, out.stderr


def test_the_torch_loader_gives_images_and_labels_with_no_argument(tmp_path):
    torch = pytest.importorskip("torch")
    import ringfeed.torch  # noqa: F401 - the module under test

    make_tree(tmp_path / "tree", per_class=4)
    loader_name = name("torch")
    loader = serve(tmp_path / "tree", loader_name, "--batch-size", "4")
    try:
        got = []
        for images, labels in ringfeed.torch.Loader(ringfeed.attach(loader_name, 0, timeout=30)):
            assert images.shape == (4, 3, 32, 32) and images.dtype == torch.uint8
            assert labels.dtype == torch.int64
            got += labels.tolist()
        # The loop variables hold the last slot until they go.
        del images, labels
        _, err = loader.communicate(timeout=60)
        assert loader.returncode == 0, err
    finally:
        kill_survivors([loader])
    assert sorted(got) == [0] * 4 + [1] * 4 + [2] * 4


def test_ringfeed_run_trains_the_image_example_with_torchrun(tmp_path):
    """examples/train_images.py: a ResNet-18 (SMALL: narrow, for the CPU) on
    images the loader decodes, two ranks under torchrun, two epochs."""
    import shutil
    import sys
    from pathlib import Path

    from e2e_util import ROOT

    pytest.importorskip("torch")
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
    assert torchrun, "torchrun not found next to %s; install torch" % sys.executable
    n = make_tree(tmp_path / "tree", per_class=16)
    job = subprocess.run(
        [ringfeed_bin(), "run", "--source", str(tmp_path / "tree"), "--batch-size", "4", "--epochs", "2",
         "--manifest-cache", "off", "--decode", "image", "--crop", "random-resized:64", "--flip",
         "--", torchrun, "--standalone", "--nproc-per-node", "2", str(ROOT / "examples" / "train_images.py")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=dict(os.environ, OMP_NUM_THREADS="1", SMALL="1"),
        timeout=240)
    out = job.stdout.decode(errors="replace")
    assert job.returncode == 0, out
    assert "epoch 1 step 0 loss" in out and "images (4, 3, 64, 64)" in out, out
    # 48 images, W×B = 8 a step: 6 steps an epoch, 2 epochs, 2 ranks.
    assert "ringfeed: done: 24 batches, 96 samples" in out, out
    assert "decoded %d images (0 could not" % (2 * n) in out, out


def test_the_image_example_validates_each_epoch_through_tail_keep(tmp_path):
    """examples/train_images.py with VAL_LOADER: a second loader serves the
    val split with --crop center --tail keep, and after each training epoch
    the two ranks take one epoch of it, every val image exactly once, and
    rank 0 prints the top-1 over all of them."""
    import shutil
    import sys
    from pathlib import Path

    from e2e_util import ROOT

    pytest.importorskip("torch")
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
    assert torchrun, "torchrun not found next to %s; install torch" % sys.executable
    make_tree(tmp_path / "train", per_class=8)
    n_val = make_tree(tmp_path / "val", per_class=5)  # 15: not a multiple of W×B = 8
    val_name = name("val")
    val = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", str(tmp_path / "val"), "--name", val_name, "--batch-size", "4",
         "--world-size", "2", "--epochs", "2", "--manifest-cache", "off", "--decode", "image",
         "--crop", "center:64", "--tail", "keep"],
        stderr=subprocess.PIPE, text=True)
    try:
        job = subprocess.run(
            [ringfeed_bin(), "run", "--source", str(tmp_path / "train"), "--batch-size", "4", "--epochs", "2",
             "--manifest-cache", "off", "--decode", "image", "--crop", "random-resized:64", "--flip",
             "--", torchrun, "--standalone", "--nproc-per-node", "2", str(ROOT / "examples" / "train_images.py")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env=dict(os.environ, OMP_NUM_THREADS="1", SMALL="1", VAL_LOADER=val_name), timeout=240)
        out = job.stdout.decode(errors="replace")
        assert job.returncode == 0, out
        _, val_err = val.communicate(timeout=60)
        assert val.returncode == 0, val_err
    finally:
        kill_survivors([val])
    assert "classes: 3 (ant ... cow)" in out, out
    for epoch in range(2):
        assert "epoch %d val top-1 " % epoch in out and "%% of %d images (%d in the val split)" % (n_val, n_val) in out, out
    assert "decoded %d images (0 could not" % (2 * n_val) in val_err, val_err


def test_tar_shard_samples_are_decoded_with_their_cls_labels(tmp_path):
    """WebDataset shards: each sample's image member decoded, its label from
    its .cls member; a sample without an image is a bad sample."""
    import tarfile

    rng = np.random.default_rng(5)
    shards = tmp_path / "shards"
    shards.mkdir()
    labels = {}
    for s in range(3):
        with tarfile.open(shards / ("shard-%02d.tar" % s), "w") as tar:
            for i in range(8):
                key = "s%02d%02d" % (s, i)
                data, ext = _encode(i, rng)
                label = (s * 8 + i) % 5
                members = [(key + ".cls", b"%d\n" % label)]
                if key != "s0103":
                    members.insert(0, (key + "." + ext.upper(), data))
                labels[key] = label
                for member, body in members:
                    info = tarfile.TarInfo(member)
                    info.size = len(body)
                    tar.addfile(info, io.BytesIO(body))
    seen, err = run(shards, "tar", 1, "--batch-size", "4", "--format", "tar", "--on-bad-sample", "zero",
                    classes=0)
    assert "labels from each tar sample's .cls member" in err, err
    assert "decoded 24 images (1 could not be decoded" in err, err
    # Manifest order is key order: sample i is the i-th key.
    keys = sorted(labels)
    for (_, index), (_, label, bad) in seen.items():
        assert label == labels[keys[index]], (index, label)
        assert bad == (keys[index] == "s0103")
