"""A Python trainer for the tar-shard tests: prints one line per field of
every sample, "epoch index key ext len crc32", read zero-copy through
Batch.fields (each view a slice of the slot, never a copy)."""
import sys
import zlib

import ringfeed


def main():
    name, rank = sys.argv[1], int(sys.argv[2])
    feed = ringfeed.attach(name=name, rank=rank, timeout=30)
    out = []
    for batch in feed:
        payload = batch.buffer()
        for i, index in enumerate(batch.indices.tolist()):
            key = batch.key(i)
            for ext, view in batch.fields(i).items():
                # Zero-copy: the view's memory lies inside the slot's payload.
                assert isinstance(view, memoryview) and view.obj is payload.obj, "field %r is not a view of the slot" % ext
                out.append("%d %d %s %s %d %d" % (batch.epoch, index, key, ext, len(view), zlib.crc32(view)))
        del payload
        batch.release()
    sys.stdout.write("\n".join(out) + ("\n" if out else ""))


if __name__ == "__main__":
    main()
