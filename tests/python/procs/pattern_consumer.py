"""A Python trainer for the mixed-language test: takes every batch of its rank
from `ringfeed ring-test-producer`, checks order and every byte against the
test pattern (tests/README.md), checks that numpy views lie inside the shared
mapping and that torch shares their memory, prints "ok N"."""
import sys

import numpy as np

import ringfeed

try:
    import torch
except ImportError:  # the test that needs torch checks it is installed
    torch = None


def main():
    name, rank, world, batch_size, sample_bytes = sys.argv[1], *map(int, sys.argv[2:6])
    feed = ringfeed.attach(name=name, rank=rank, timeout=30)
    info = feed.info
    lo = info.payload_region_address
    hi = lo + info.payload_region_bytes
    positions = np.arange(sample_bytes, dtype=np.uint64)
    n = 0
    torch_checked = False
    for batch in feed:
        if batch.step != n or len(batch) != batch_size:
            raise SystemExit("rank %d: got step %d with %d samples, expected step %d" % (rank, batch.step, len(batch), n))
        want = (np.uint64(n * world + rank) * np.uint64(batch_size)) + np.arange(batch_size, dtype=np.uint64)
        if not np.array_equal(batch.indices, want):
            raise SystemExit("rank %d step %d: indices %s, expected %s" % (rank, n, batch.indices, want))
        arr = batch.array("uint8", (batch_size, sample_bytes))
        addr = arr.__array_interface__["data"][0]
        if not (lo <= addr and addr + arr.nbytes <= hi):
            raise SystemExit("rank %d: numpy view at %#x is outside the ring's payload region %#x..%#x" % (rank, addr, lo, hi))
        expected = ((want[:, None] * np.uint64(7) + positions[None, :]) % np.uint64(251)).astype(np.uint8)
        if not np.array_equal(arr, expected):
            raise SystemExit("rank %d step %d: bytes differ from the pattern" % (rank, n))
        if torch is not None and not torch_checked:
            t = torch.from_numpy(arr)
            if t.data_ptr() != addr:
                raise SystemExit("rank %d: torch tensor at %#x does not share the view at %#x" % (rank, t.data_ptr(), addr))
            del t
            torch_checked = True
        del arr
        batch.release()
        n += 1
    print("ok %d torch=%s" % (n, "shared" if torch_checked else "absent"))


if __name__ == "__main__":
    main()
