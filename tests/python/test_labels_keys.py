"""Labels a trainer can use, labels through pack, class names and keys
(issue 36 item 11, issue 37 items 2 and 3).

- A `.cls` value a trainer cannot use (-1, CrossEntropyLoss's ignore_index
  -100, -7, or past `--num-classes`) is a bad sample: the run stops naming
  the sample and the value, or with `--on-bad-sample zero` it is a zero
  image, flagged.
- `ringfeed pack` of an ImageFolder tree writes each sample's class index as
  a `.cls` member and the class names into the shards' indexes: serving the
  shards gives the labels and `feed.classes` that serving the tree gives.
- A tar source with images but no label member anywhere refuses to serve.
- `batch.key(i)` for files, records and tar (also under `--decode image`),
  from Python and from C (`rf_batch_key`, `rf_get_class_name`).
"""

import io
import os
import subprocess
import tarfile
import threading
import uuid

import numpy as np
import pytest

import ringfeed
from e2e_util import compile_c, kill_survivors, ringfeed_bin

PIL = pytest.importorskip("PIL.Image")

CLASSES = ["ant", "bee", "cow"]


def name(what):
    return "lk-%s-%s" % (what, uuid.uuid4().hex[:8])


def jpeg(i):
    rng = np.random.default_rng(i)
    out = io.BytesIO()
    PIL.fromarray(rng.integers(0, 256, (40 + i % 7, 48, 3), dtype=np.uint8)).save(out, "JPEG", quality=85)
    return out.getvalue()


def make_tree(root, per_class=5):
    """An ImageFolder tree: root/<class>/NNN.jpg (and a nested one)."""
    for c in CLASSES:
        (root / c / "sub").mkdir(parents=True)
        for i in range(per_class):
            where = root / c / "sub" if i == 0 else root / c
            (where / ("%03d.jpg" % i)).write_bytes(jpeg(i))
    return len(CLASSES) * per_class


def write_shard(path, samples):
    """samples: [(key, {ext: bytes})] into one tar shard, in order."""
    with tarfile.open(path, "w") as tar:
        for key, fields in samples:
            for ext, body in fields.items():
                info = tarfile.TarInfo("%s.%s" % (key, ext))
                info.size = len(body)
                tar.addfile(info, io.BytesIO(body))


def serve(source, loader, *flags):
    return subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", str(source), "--name", loader, "--manifest-cache", "off",
         "--seed", "3", *flags],
        stderr=subprocess.PIPE, text=True)


def read_all(loader, rank=0, keys=True):
    """[(epoch, index, key, label or None, bad or None)] of one rank, and
    the feed's classes (keys None unless asked for)."""
    rows = []
    with ringfeed.attach(loader, rank, timeout=30) as feed:
        classes = feed.classes
        images = feed.info.images
        for batch in feed:
            names = batch.keys() if keys else [None] * len(batch)
            if keys:
                assert [batch.key(i) for i in range(len(batch))] == names
            labels = batch.labels.tolist() if images else [None] * len(batch)
            bad = batch.bad.tolist() if images else [None] * len(batch)
            for i, index in enumerate(batch.indices.tolist()):
                rows.append((batch.epoch, index, names[i], labels[i], bad[i]))
            del labels, bad
            batch.release()
    return rows, classes


def run(source, what, *flags, keys=True):
    loader_name = name(what)
    loader = serve(source, loader_name, *flags)
    try:
        rows, classes = read_all(loader_name, keys=keys)
        _, err = loader.communicate(timeout=60)
        assert loader.returncode == 0, err
    finally:
        kill_survivors([loader])
    return rows, classes, err


def refused(source, what, *flags):
    """Serves `source` to a trainer that takes what comes; the loader must
    fail. Returns its stderr. (A loader that serves everything instead
    ends well, and the assertion says so.)"""
    loader_name = name(what)
    loader = serve(source, loader_name, *flags)
    try:
        try:
            read_all(loader_name, keys=False)
        except ringfeed.Error:
            pass  # the loader's failure, as the trainer sees it
        _, err = loader.communicate(timeout=60)
    finally:
        kill_survivors([loader])
    assert loader.returncode != 0, "the loader served the whole run:\n" + err
    return err


def labelled_shards(root, labels):
    """One shard of samples s00, s01, ... each a JPEG and a .cls of `labels[i]`."""
    root.mkdir()
    write_shard(root / "shard-0.tar", [("s%02d" % i, {"jpg": jpeg(i), "cls": b"%d\n" % v})
                                       for i, v in enumerate(labels)])


def test_labels_a_trainer_cannot_use_are_bad_samples_named_with_their_value(tmp_path):
    """Issue 36 item 11: -1, -100 (CrossEntropyLoss's ignore_index) and -7
    were served as good samples. Now the default policy stops the run naming
    the sample and its value; `zero` serves a zero image flagged bad; with
    --num-classes N a label of N or more is bad too."""
    labels = [0, 2, -1, 1, -100, 4, -7, 2]
    labelled_shards(tmp_path / "shards", labels)
    flags = ["--batch-size", "4", "--decode", "image", "--crop", "center:32", "--no-shuffle"]
    err = refused(tmp_path / "shards", "err", *flags)
    # The first bad one in order is s02's -1.
    assert "sample 2 (" in err and "has label -1 (its .cls member)" in err and "--on-bad-sample zero" in err, err

    rows, _, err = run(tmp_path / "shards", "zero", *flags, "--on-bad-sample", "zero", keys=False)
    got = {index: (label, bad) for _, index, _, label, bad in rows}
    assert sorted(got) == list(range(len(labels)))
    bad = sorted(i for i, (_, b) in got.items() if b)
    assert bad == [2, 4, 6], got
    assert all(got[i][0] == labels[i] for i in range(len(labels)) if i not in bad), got
    assert "(3 could not be decoded" in err, err

    rows, _, err = run(tmp_path / "shards", "classes", *flags, "--on-bad-sample", "zero", "--num-classes", "3",
                       keys=False)
    bad = sorted(index for _, index, _, _, b in rows if b)
    assert bad == [2, 4, 5, 6], "label 4 of 3 classes is bad too: %r" % rows
    err = refused(tmp_path / "shards", "n3", *flags, "--num-classes", "3")
    assert "has label -1" in err, err
    # ignore_index is named as such.
    labelled_shards(tmp_path / "ignore", [0, -100])
    err = refused(tmp_path / "ignore", "ign", "--batch-size", "2", *flags[2:])
    assert "has label -100" in err and "ignore_index" in err, err


def test_packing_an_image_folder_tree_keeps_its_labels_and_class_names(tmp_path):
    n = make_tree(tmp_path / "tree")
    dest = tmp_path / "shards"
    p = subprocess.run([ringfeed_bin(), "pack", "--source", str(tmp_path / "tree"), "--dest", str(dest),
                        "--shard-size", "8KiB"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "each sample gets a .cls member" in p.stderr and "3 classes" in p.stderr, p.stderr
    shards = sorted(dest.glob("*.tar"))
    assert len(shards) > 1
    with tarfile.open(shards[0]) as t:
        names = t.getnames()
        # Byte order: ant/001.* before ant/sub/000.*; the label sorts before its image.
        assert names[:2] == ["ant/001.cls", "ant/001.jpg"], names
        assert t.extractfile("ant/001.cls").read() == b"0"
    for shard in shards:
        index = (dest / (shard.name + ".idx")).read_bytes()
        assert index.startswith(b"ringfeed-tar-index 2\n") and b"\nclass ant\nclass bee\nclass cow\n" in index

    flags = ["--batch-size", "3", "--decode", "image", "--crop", "center:32", "--no-shuffle"]
    tree, tree_classes, _ = run(tmp_path / "tree", "tree", *flags)
    packed, packed_classes, err = run(dest, "packed", *flags)
    assert tree_classes == packed_classes == CLASSES
    assert "labels from each tar sample's .cls member, 3 classes (ant … cow)" in err, err
    assert len(tree) == len(packed) == n // 3 * 3
    # Sample i is the same image either way: same label; the tree's key is
    # the file, the shards' the WebDataset key.
    for (_, i, tkey, tlabel, tbad), (_, j, pkey, plabel, pbad) in zip(tree, packed):
        assert i == j and tlabel == plabel and not tbad and not pbad, (tkey, pkey)
        assert pkey == tkey.rsplit(".", 1)[0]
        assert CLASSES[tlabel] == tkey.split("/")[0]
    # --labels none packs the files alone.
    plain = tmp_path / "plain"
    p = subprocess.run([ringfeed_bin(), "pack", "--source", str(tmp_path / "tree"), "--dest", str(plain),
                        "--labels", "none"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    with tarfile.open(next(plain.glob("*.tar"))) as t:
        assert not [m for m in t.getnames() if m.endswith(".cls")]


def test_a_tar_source_with_images_and_no_label_member_refuses_unless_told(tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    write_shard(shards / "a.tar", [("%s/%02d" % (CLASSES[i % 3], i), {"jpg": jpeg(i)}) for i in range(9)])
    flags = ["--batch-size", "3", "--decode", "image", "--crop", "center:32", "--no-shuffle"]
    err = refused(shards, "nolabel", *flags)
    assert "no sample of the tar shards has a .cls member" in err and "--labels dirs" in err \
        and "--labels none" in err, err
    rows, classes, _ = run(shards, "none", *flags, "--labels", "none", keys=False)
    assert classes == [] and {label for *_, label, _ in rows} == {-1}
    # --labels dirs: the first directory of each key, as for a tree.
    rows, classes, err = run(shards, "dirs", *flags, "--labels", "dirs")
    assert classes == CLASSES, err
    assert all(CLASSES[label] == key.split("/")[0] and not bad for _, _, key, label, bad in rows), rows


@pytest.fixture(scope="module")
def keys_c(tmp_path_factory):
    return compile_c("keys.c", tmp_path_factory.mktemp("cbin"))


def c_rows(keys_c, loader, rank=0):
    out = subprocess.run([keys_c, loader, str(rank)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    classes = [line.split(" ", 2)[2] for line in out.stdout.splitlines() if line.startswith("class ")]
    keys = {}
    for line in out.stdout.splitlines():
        if line.startswith("key "):
            _, epoch, index, record, key = line.split(" ", 4)
            keys[(int(epoch), int(index))] = key if record == "-" else (key, int(record))
    return keys, classes


def serve_to_python_and_c(keys_c, source, what, *flags):
    """Rank 0 read from Python, rank 1 from C; {(epoch, index): key} of each."""
    loader_name = name(what)
    loader = serve(source, loader_name, "--world-size", "2", *flags)
    result = {}
    thread = threading.Thread(target=lambda: result.update(c=c_rows(keys_c, loader_name, 1)))
    try:
        thread.start()
        rows, classes = read_all(loader_name, 0)
        thread.join(120)
        _, err = loader.communicate(timeout=60)
        assert loader.returncode == 0, err
    finally:
        kill_survivors([loader])
    assert "c" in result, "the C rank failed (see above)"
    py = {(e, i): k for e, i, k, _, _ in rows}
    return py, result["c"][0], classes, result["c"][1]


def test_batch_key_gives_every_sources_keys_from_python_and_c(tmp_path, keys_c):
    # Files: nested, odd names; the key is the path relative to the source.
    tree = tmp_path / "files"
    names = ["a/b/one.bin", "a/two words.bin", "caf\u00e9.bin", "z/%d.bin" % 7, "top"]
    for i, rel in enumerate(names):
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_bytes(bytes([i]) * (10 + i))
    py, c, _, _ = serve_to_python_and_c(keys_c, tree, "files", "--batch-size", "1", "--no-shuffle")
    order = sorted(names, key=lambda s: s.encode())
    assert py == {(0, 0): order[0], (0, 2): order[2]} and c == {(0, 1): order[1], (0, 3): order[3]}, (py, c)

    # Records: the object's key and the record's index in it.
    recs = tmp_path / "records"
    recs.mkdir()
    (recs / "a.bin").write_bytes(bytes(12))
    (recs / "b.bin").write_bytes(bytes(8))
    py, c, _, _ = serve_to_python_and_c(keys_c, recs, "records", "--batch-size", "1", "--record-bytes", "4",
                                        "--no-shuffle")
    want = {(0, 0): ("a.bin", 0), (0, 1): ("a.bin", 1), (0, 2): ("a.bin", 2), (0, 3): ("b.bin", 0)}
    assert {**py, **c} == want, (py, c)

    # Tar shards: the WebDataset key, raw and decoded (the images replace
    # the samples' bytes; the keys stay), with the class names in C too.
    shards = tmp_path / "shards"
    shards.mkdir()
    keys = ["%s/%03d" % (CLASSES[i % 3], i) for i in range(12)]
    write_shard(shards / "s.tar", [(k, {"jpg": jpeg(i), "cls": b"%d" % (i % 3)}) for i, k in enumerate(keys)])
    for flags in [(), ("--decode", "image", "--crop", "center:32", "--labels", "dirs")]:
        py, c, py_classes, c_classes = serve_to_python_and_c(
            keys_c, shards, "tar", "--batch-size", "3", "--format", "tar", *flags)
        both = {**py, **c}
        assert both == {(0, i): keys[i] for i in range(12)}, both
        assert py_classes == c_classes == (CLASSES if flags else [])


def test_batch_key_gives_a_remote_objects_key_relative_to_the_prefix(tmp_path, keys_c):
    """Remote too: the key of an object served from http(s):// (nginx
    WebDAV) is its key under the source prefix, as for a local tree."""
    import shutil
    from pathlib import Path

    from remote_util import need_server

    url = need_server("nginx")
    base = Path(os.environ["RINGFEED_TEST_NGINX_ROOT"]) / name("keys")
    names = ["a/b/one.bin", "a/two.bin", "z.bin", "zz/last.bin"]
    for i, rel in enumerate(names):
        (tmp_path / "tree" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "tree" / rel).write_bytes(bytes([i]) * 33)
    shutil.copytree(tmp_path / "tree", base / "train")
    try:
        source = url + base.name + "/train/"
        py, c, _, _ = serve_to_python_and_c(keys_c, source, "remote", "--batch-size", "1", "--no-shuffle")
        assert {**py, **c} == {(0, i): k for i, k in enumerate(names)}, (py, c)
    finally:
        shutil.rmtree(base, ignore_errors=True)
