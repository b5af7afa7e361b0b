"""Token corpora for the tests of `serve --seq-len` (issue 38): documents, each
format written by its reference writer where one installs, a writer from the
published layout where none does, and a loader run read back by every rank.

Writers (docs/tokens.md, "Formats"):
- flat: the tokens end to end (nanoGPT's train.bin);
- megatron: megatron-core's IndexedDatasetBuilder (megatron.core.datasets), else
  `write_megatron_layout`, the .idx byte by byte as indexed_dataset.py writes it;
- datatrove: `write_datatrove_layout`, as datatrove's TokenizedFile writes it
  (tokens, then the .ds.index of uint64 document ends): datatrove itself needs a
  newer huggingface_hub than the test venv keeps, so it is not installed;
- litdata: litdata.optimize(..., item_loader=TokensLoader());
- mds: streaming.MDSWriter with an ndarray token column (and zstd shards).
"""

import os
import pickle
import struct
import subprocess
import tempfile
import uuid
from pathlib import Path

import numpy as np

from e2e_util import kill_survivors, python_consumer, ringfeed_bin, wait_all


def documents(n, seed, vocab=50000, lo=1, hi=300):
    """`n` documents of random lengths (some empty), uint16 token ids."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(lo, hi, size=n)
    lengths[rng.random(n) < 0.03] = 0
    return [rng.integers(0, vocab, size=int(k), dtype=np.uint16) for k in lengths]


def concatenation(docs, eos=None):
    """The stream windows are cut from, and where each document starts in it
    (the documents that hold tokens, or, with a separator, all but the last)."""
    parts, starts, at = [], [], 0
    for i, d in enumerate(docs):
        starts.append((at, len(d) + (1 if eos is not None and i + 1 < len(docs) else 0)))
        parts.append(np.asarray(d, dtype=np.uint64))
        at += len(d)
        if eos is not None and i + 1 < len(docs):
            parts.append(np.array([eos], dtype=np.uint64))
            at += 1
    stream = np.concatenate(parts) if parts else np.zeros(0, np.uint64)
    return stream, [s for s, length in starts if length > 0]


# ------------------------------------------------------------------ writers


def write_flat(path, docs, dtype=np.uint16):
    np.concatenate([np.asarray(d, dtype=dtype) for d in docs]).tofile(path)


def write_megatron_layout(prefix, docs, dtype=np.uint16):
    """PREFIX.bin and PREFIX.idx as megatron/core/datasets/indexed_dataset.py's
    IndexedDatasetBuilder writes them (one sequence per document)."""
    codes = {np.uint8: 1, np.int8: 2, np.int16: 3, np.int32: 4, np.int64: 5, np.uint16: 8}
    arrays = [np.asarray(d, dtype=dtype) for d in docs]
    with open(str(prefix) + ".bin", "wb") as f:
        for a in arrays:
            f.write(a.tobytes())
    lengths = np.array([len(a) for a in arrays], dtype=np.int32)
    pointers = np.concatenate([[0], np.cumsum(lengths.astype(np.int64) * np.dtype(dtype).itemsize)[:-1]]).astype(np.int64)
    doc_idx = np.arange(len(arrays) + 1, dtype=np.int64)
    with open(str(prefix) + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", codes[dtype]))
        f.write(struct.pack("<Q", len(lengths)))
        f.write(struct.pack("<Q", len(doc_idx)))
        f.write(lengths.tobytes())
        f.write(pointers.tobytes())
        f.write(doc_idx.tobytes())


def megatron_core():
    """megatron-core's writer module, or None where it is not installed."""
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from megatron.core.datasets import indexed_dataset
        return indexed_dataset
    except ImportError:
        return None


def write_megatron(prefix, docs, dtype=np.uint16):
    """PREFIX.bin/.idx by megatron-core's own IndexedDatasetBuilder when it
    installs, else by the layout; returns which wrote it."""
    mc = megatron_core()
    if mc is None:
        write_megatron_layout(prefix, docs, dtype)
        return "layout"
    import torch

    builder = mc.IndexedDatasetBuilder(str(prefix) + ".bin", dtype=dtype)
    for d in docs:
        builder.add_document(torch.from_numpy(np.asarray(d, dtype=np.int64)), [len(d)])
    builder.finalize(str(prefix) + ".idx")
    return "megatron-core"


def write_datatrove_layout(directory, name, docs, dtype=np.uint16, loss=False):
    """NAME.ds (tokens end to end) and NAME.ds.index (uint64 document ends, in
    tokens) as datatrove's TokenizedFile writes them; NAME.ds.loss (a bool per
    token) when `loss`."""
    directory = Path(directory)
    arrays = [np.asarray(d, dtype=dtype) for d in docs]
    (directory / (name + ".ds")).write_bytes(b"".join(a.tobytes() for a in arrays))
    ends = np.cumsum([len(a) for a in arrays]).astype("<u8")
    (directory / (name + ".ds.index")).write_bytes(struct.pack("<%dQ" % len(ends), *ends.tolist()))
    if loss:
        (directory / (name + ".ds.loss")).write_bytes(np.ones(int(ends[-1]), dtype=bool).tobytes())


def _litdata_item(doc):
    import torch

    return torch.from_numpy(np.asarray(doc, dtype=np.uint16).copy())


def write_litdata(directory, docs, chunk_bytes="64KB"):
    """litdata.optimize with TokensLoader, one worker (items in input order).
    Empty documents are left out: optimize() has nothing to write for them.
    Returns the documents written, in order."""
    from litdata import optimize
    from litdata.streaming.item_loader import TokensLoader

    kept = [d for d in docs if len(d)]
    optimize(fn=_LitItem(kept), inputs=list(range(len(kept))), output_dir=str(directory), chunk_bytes=chunk_bytes,
             item_loader=TokensLoader(), num_workers=1, mode="overwrite")
    return kept


class _LitItem:
    """optimize()'s fn: input i becomes document i (a picklable callable)."""

    def __init__(self, docs):
        self.docs = docs

    def __call__(self, i):
        return _litdata_item(self.docs[i])


def write_mds(directory, docs, compression=None, size_limit=1 << 14, extra_column=True):
    """streaming.MDSWriter with a `tokens` ndarray:uint16 column (and a text
    column before it when `extra_column`). Empty documents are left out: MDS
    refuses empty arrays. Returns the documents written, in order."""
    from streaming import MDSWriter

    columns = {"tokens": "ndarray:uint16"}
    if extra_column:
        columns["id"] = "str"
    kept = [d for d in docs if len(d)]
    with MDSWriter(out=str(directory), columns=columns, compression=compression, size_limit=size_limit) as w:
        for i, d in enumerate(kept):
            sample = {"tokens": np.asarray(d, dtype=np.uint16)}
            if extra_column:
                sample["id"] = "doc-%d" % i
            w.write(sample)
    return kept


# ------------------------------------------------------------- a loader run


def name(what):
    return "tok-%s-%s" % (what, uuid.uuid4().hex[:8])


def serve(sources, loader, seq_len, batch_size, world_size, *flags, env=None):
    args = [ringfeed_bin(), "serve", "--name", loader, "--seq-len", str(seq_len), "--batch-size", str(batch_size),
            "--world-size", str(world_size), *flags]
    for s in sources:
        args += ["--source", str(s)]
    return subprocess.Popen(args, stderr=subprocess.PIPE, text=True, env=env)


def read_all(loader, world_size, out_dir, timeout=120):
    """Every batch of every rank (one process each, procs/token_consumer.py):
    a list of dicts (epoch, step, rank, indices, tokens (n, L+1) uint64,
    starts, counts, resume_state, cu_seqlens), and the failures."""
    procs, outs = [], []
    for r in range(world_size):
        out = os.path.join(str(out_dir), "%s-rank%d.pickle" % (loader, r))
        outs.append(out)
        procs.append(subprocess.Popen(python_consumer("token_consumer.py", loader, r, out), stderr=subprocess.PIPE, text=True))
    rows, errors = [], []
    for r, (code, _, err) in enumerate(wait_all(procs, timeout)):
        if code != 0:
            errors.append("rank %d exited %s: %s" % (r, code, err[-3000:]))
            continue
        with open(outs[r], "rb") as f:
            rows.extend(pickle.load(f))
    return rows, errors


def run(sources, seq_len, batch_size, world_size, *flags, timeout=120):
    """Serves and reads a whole run; returns (rows, stderr). Fails on an error."""
    loader = name("run")
    p = serve(sources, loader, seq_len, batch_size, world_size, *flags)
    try:
        with tempfile.TemporaryDirectory() as out_dir:
            rows, errors = read_all(loader, world_size, out_dir)
        if errors:
            p.kill()
        _, err = p.communicate(timeout=timeout)
    finally:
        kill_survivors([p])
    assert not errors, "\n".join(errors) + "\n" + err
    assert p.returncode == 0, err
    return rows, err


def positions(rows, world_size, batch_size, start=0):
    """{(epoch, position): row, i} in the order of the epoch: step s of rank r
    holds positions start + s·W·B + r·B + i (start only in the first epoch)."""
    first_epoch = min(r["epoch"] for r in rows) if rows else 0
    out = {}
    for row in rows:
        base = (start if row["epoch"] == first_epoch else 0) + row["step"] * world_size * batch_size + row["rank"] * batch_size
        for i, index in enumerate(row["indices"]):
            out[(row["epoch"], base + i)] = (index, row["tokens"][i], row["starts"][i])
    return out


def check_windows(rows, stream, doc_starts, seq_len, base=0, count=None):
    """Every window of `rows` whose index is in [base, base + count) equals its
    slice of the model stream, and its document starts the model's."""
    starts = np.asarray(doc_starts, dtype=np.int64)
    checked = 0
    for row in rows:
        for i, index in enumerate(row["indices"]):
            if index < base or (count is not None and index >= base + count):
                continue
            k = index - base
            v0, v1 = k * seq_len, k * seq_len + seq_len + 1
            got = row["tokens"][i]
            want = stream[v0:v1]
            assert np.array_equal(got, want), "window %d: %s != %s" % (k, got[:8], want[:8])
            inside = starts[(starts >= v0) & (starts < v1)] - v0
            assert row["starts"][i] == inside.tolist(), "window %d: starts %s != %s" % (k, row["starts"][i], inside.tolist())
            checked += 1
    return checked
