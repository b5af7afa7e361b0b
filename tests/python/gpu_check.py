"""The CUDA path of ringfeed.torch.Loader, on a machine with a GPU: one short
run (under 2 minutes), not a pytest file (pytest skips it without CUDA).

    RINGFEED_BIN=target/release/ringfeed python tests/python/gpu_check.py

It writes a synthetic record dataset (record i: its id i as u64, then byte p
is (i * 7 + p) % 251), starts its own `ringfeed serve` over it, and checks,
with the ring pinned and then unpinned:
- every batch reaches the GPU whole: each row's bytes on the GPU are those of
  the record its index names, and each epoch covers every record once;
- the first batches on the GPU equal the CPU view of their slot, read before
  the slot went back;
- no slot goes back before its copy's CUDA event has completed;
- the loader exits 0 (every slot given back), and the ring is unpinned on
  close;
- examples/train_ddp.py trains under torchrun, one rank, on the GPU.
It prints the host-to-device throughput from the pinned ring and from
pageable memory (raw copies of one batch), and the loader's end-to-end rate
pinned and unpinned. Exits non-zero on the first failed check.
"""

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bindings" / "python"))
if not os.environ.get("RINGFEED_LIB") and (ROOT / "target" / "release" / "libringfeed.so").exists():
    os.environ["RINGFEED_LIB"] = str(ROOT / "target" / "release" / "libringfeed.so")

import numpy as np  # noqa: E402
import torch  # noqa: E402

RECORD_BYTES = 1 << 20  # 1 MiB a sample
BATCH = 16  # 16 MiB a batch
SLOTS = 4  # 64 MiB of ring to pin
RECORDS = 512  # 32 steps an epoch
EPOCHS = 2
VERIFY_FIRST = 6  # batches compared with their CPU view
RAW_COPIES = 20
DEADLINE_S = 115
EXAMPLE_RECORD_BYTES = 256  # 128 uint16 tokens
EXAMPLE_RECORDS = 300  # 75 steps of one rank
EXAMPLE_TIMEOUT_S = 60
ATTACH_TIMEOUT_S = 30


def ringfeed_bin():
    path = os.environ.get("RINGFEED_BIN") or str(ROOT / "target" / "release" / "ringfeed")
    if not os.path.isfile(path):
        sys.exit("gpu_check: no ringfeed binary at %s: build it (cargo build --release) or set RINGFEED_BIN" % path)
    return path


def write_dataset(root):
    # Byte p of record i is tile[i * 7 % 251 + p]: a slice, no arithmetic a record.
    tile = (np.arange(251 + RECORD_BYTES) % 251).astype(np.uint8)
    with open(os.path.join(root, "records.bin"), "wb") as f:
        for i in range(RECORDS):
            start = i * 7 % 251
            f.write(np.uint64(i).tobytes())
            f.write(tile[start + 8 : start + RECORD_BYTES].data)


def serve(root, epochs):
    name = "gpu-check-%s" % uuid.uuid4().hex[:8]
    proc = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", root, "--name", name, "--batch-size", str(BATCH),
         "--record-bytes", str(RECORD_BYTES), "--world-size", "1", "--epochs", str(epochs), "--seed", "3",
         "--slots-per-rank", str(SLOTS), "--manifest-cache", "off"],
        stderr=subprocess.PIPE, text=True)
    return name, proc


def attach(ringfeed, name, proc):
    """Attaches to rank 0 of the loader ``proc`` serves, or fails with its
    own error if it exits first (no /dev/shm room, say)."""
    deadline = time.monotonic() + ATTACH_TIMEOUT_S
    while True:
        try:
            return ringfeed.attach(name, 0, timeout=1)
        except (ringfeed.TimeoutError, ringfeed.LoaderGoneError):
            if proc.poll() is not None:
                fail("the loader exited %d before serving:\n%s" % (proc.returncode, proc.stderr.read()[-2000:]))
            if time.monotonic() > deadline:
                fail("no loader %r within %d s" % (name, ATTACH_TIMEOUT_S))


def finish(proc, what):
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        fail("%s: the loader did not exit after the run (a slot not given back?):\n%s" % (what, err[-2000:]))
    if proc.returncode != 0:
        fail("%s: the loader exited %d:\n%s" % (what, proc.returncode, err[-2000:]))


def fail(message):
    print("gpu_check: FAILED: %s" % message, flush=True)
    sys.exit(1)


def make_checked_loader_class(ringfeed_torch):
    class CheckedLoader(ringfeed_torch.Loader):
        """Records every release (asserting its copy's event completed) and
        keeps a CPU copy of the first batches' slots, read before release."""

        def __init__(self, *args, **kwargs):
            self.releases = 0
            self.cpu_copies = {}
            super().__init__(*args, **kwargs)

        def _copy(self, batch):
            entry = super()._copy(batch)
            if len(self.cpu_copies) < VERIFY_FIRST:
                assert entry.host.is_pinned() == self.pinned, "is_pinned() %s, pinned %s" % (entry.host.is_pinned(), self.pinned)
                self.cpu_copies[(entry.epoch, entry.step)] = entry.host.clone()
            return entry

        def _release(self, entry):
            if not entry.event.query():
                fail("the slot of epoch %d step %d went back before its copy's event completed" % (entry.epoch, entry.step))
            self.releases += 1
            super()._release(entry)

    return CheckedLoader


def check_rows(x, indices):
    """Each row of ``x`` (on the GPU) is the record its index names."""
    n = x.shape[0]
    ids = x[:, :8].contiguous().view(torch.int64).reshape(n)
    want = torch.from_numpy(indices.astype(np.int64)).to(x.device)
    if not torch.equal(ids, want):
        fail("ids on the GPU %s differ from the batch's indices %s" % (ids.tolist(), want.tolist()))
    p = torch.arange(RECORD_BYTES, device=x.device, dtype=torch.int64)
    body = (ids[:, None] * 7 + p[None, :]) % 251
    if not torch.equal(x[:, 8:].long(), body[:, 8:]):
        bad = (x[:, 8:].long() != body[:, 8:]).nonzero()[0].tolist()
        fail("row %d byte %d on the GPU is not its record's" % (bad[0], bad[1] + 8))


def run_pass(root, pinned, ringfeed, ringfeed_torch):
    name, proc = serve(root, EPOCHS)
    device = torch.device("cuda", 0)
    loader_class = make_checked_loader_class(ringfeed_torch)
    try:
        feed = attach(ringfeed, name, proc)
        loader = loader_class(feed, dtype=torch.uint8, shape=(RECORD_BYTES,), device=device, pin_memory=pinned)
        if loader.pinned != pinned:
            fail("pin_memory=%s but loader.pinned is %s" % (pinned, loader.pinned))
        seen = {}
        batches = 0
        torch.cuda.synchronize()
        start = time.monotonic()
        # Every epoch: a `for` over a Loader is one.
        for x in (batch for _epoch in loader.epochs() for batch in loader):
            if x.device != device or x.shape != (BATCH, RECORD_BYTES):
                fail("got a tensor of shape %s on %s" % (tuple(x.shape), x.device))
            check_rows(x, loader.indices)
            cpu = loader.cpu_copies.pop((loader.epoch, loader.step), None)
            if cpu is not None and not torch.equal(x.cpu(), cpu):
                fail("epoch %d step %d on the GPU differs from its CPU view" % (loader.epoch, loader.step))
            seen.setdefault(loader.epoch, []).extend(int(i) for i in loader.indices)
            batches += 1
        torch.cuda.synchronize()
        elapsed = time.monotonic() - start
        for epoch, ids in seen.items():
            if sorted(ids) != list(range(RECORDS)):
                fail("epoch %d did not cover every record once" % epoch)
        if sorted(seen) != list(range(EPOCHS)) or batches != EPOCHS * RECORDS // BATCH:
            fail("%d batches over epochs %s, expected %d over %d" % (batches, sorted(seen), EPOCHS * RECORDS // BATCH, EPOCHS))
        if loader.releases != batches:
            fail("%d slots given back for %d batches" % (loader.releases, batches))
        loader.close()
        if loader.pinned:
            fail("the ring is still pinned after close()")
        feed.close()
        del x, loader, feed
        finish(proc, "pinned" if pinned else "unpinned")
        return batches * BATCH * RECORD_BYTES / elapsed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def raw_h2d(root, ringfeed, ringfeed_torch):
    """GB/s of copies of one batch: from the pinned ring, and from pageable memory."""
    name, proc = serve(root, 1)
    device = torch.device("cuda", 0)
    try:
        feed = attach(ringfeed, name, proc)
        loader = ringfeed_torch.Loader(feed, device=device)  # pins the ring
        batch = feed.next(timeout=ATTACH_TIMEOUT_S)
        ring_view = torch.from_numpy(batch.array())
        pageable = ring_view.clone()
        if not ring_view.is_pinned() or pageable.is_pinned():
            fail("is_pinned(): ring view %s, pageable copy %s" % (ring_view.is_pinned(), pageable.is_pinned()))
        rates = {}
        for what, src in (("pinned ring", ring_view), ("pageable", pageable)):
            dst = torch.empty(src.shape, dtype=src.dtype, device=device)
            dst.copy_(src, non_blocking=True)  # warm up
            torch.cuda.synchronize()
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            for _ in range(RAW_COPIES):
                dst.copy_(src, non_blocking=True)
            end.record()
            end.synchronize()
            rates[what] = RAW_COPIES * src.numel() / (begin.elapsed_time(end) / 1000.0)
            if not torch.equal(dst.cpu(), pageable):
                fail("a raw copy from the %s differs from the slot's bytes" % what)
        del ring_view, batch
        loader.close()
        for b in feed:
            b.release()
        feed.close()
        del loader, feed
        finish(proc, "raw copies")
        return rates
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def run_example(root):
    """examples/train_ddp.py under torchrun, one rank on the GPU: the
    Loader's pinned path in the example, end to end."""
    data = os.path.join(root, "tokens")
    os.mkdir(data)
    with open(os.path.join(data, "tokens.bin"), "wb") as f:
        f.write(os.urandom(EXAMPLE_RECORD_BYTES * EXAMPLE_RECORDS))
    name = "gpu-check-example-%s" % uuid.uuid4().hex[:8]
    proc = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", data, "--name", name, "--batch-size", "4",
         "--record-bytes", str(EXAMPLE_RECORD_BYTES), "--world-size", "1", "--manifest-cache", "off"],
        stderr=subprocess.PIPE, text=True)
    env = dict(os.environ, RINGFEED_NAME=name, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "bindings" / "python"), os.environ.get("PYTHONPATH")])))
    try:
        job = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
             str(ROOT / "examples" / "train_ddp.py")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=EXAMPLE_TIMEOUT_S)
        if job.returncode != 0 or "epoch 0 step 20 loss" not in job.stdout:
            fail("examples/train_ddp.py on the GPU exited %d:\n%s" % (job.returncode, job.stdout[-3000:]))
        finish(proc, "the example")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def main():
    if not torch.cuda.is_available():
        print("gpu_check: SKIPPED: CUDA is not available (torch %s)" % torch.__version__)
        return 0
    signal.signal(signal.SIGALRM, lambda *_: fail("took over %d s" % DEADLINE_S))
    signal.alarm(DEADLINE_S)
    import ringfeed
    import ringfeed.torch as ringfeed_torch

    print("gpu_check: %s, torch %s, ringfeed %s" % (torch.cuda.get_device_name(0), torch.__version__, ringfeed.library_path))
    with tempfile.TemporaryDirectory(prefix="ringfeed-gpu-check-") as root:
        begin = time.monotonic()
        write_dataset(root)
        print("gpu_check: dataset of %d records of %d bytes written in %.1f s" % (RECORDS, RECORD_BYTES, time.monotonic() - begin))
        rates = raw_h2d(root, ringfeed, ringfeed_torch)
        for what, rate in rates.items():
            print("gpu_check: H2D copy of one %d MiB batch from %s memory: %.1f GB/s" % (BATCH * RECORD_BYTES >> 20, what, rate / 1e9))
        for pinned in (True, False):
            rate = run_pass(root, pinned, ringfeed, ringfeed_torch)
            print("gpu_check: Loader(device='cuda', pin_memory=%s): %d batches checked on the GPU, %.2f GB/s end to end"
                  % (pinned, EPOCHS * RECORDS // BATCH, rate / 1e9))
        begin = time.monotonic()
        run_example(root)
        print("gpu_check: examples/train_ddp.py trained on the GPU through the pinned ring in %.0f s" % (time.monotonic() - begin))
    print("gpu_check: OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
