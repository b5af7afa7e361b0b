"""A Python trainer for the throttle tests (throttle_util.py): like
hash_consumer.py, one line per sample, "epoch step index len crc32", and a
line "t WALLTIME" when each batch arrives (the first and the last time the
time to first batch and the epoch)."""
import sys
import time
import zlib

import ringfeed


def main():
    feed = ringfeed.attach(name=sys.argv[1], rank=0, timeout=60)
    out = []
    for batch in feed:
        out.append("t %.6f" % time.time())
        for i, index in enumerate(batch.indices.tolist()):
            view = batch.sample(i)
            out.append("%d %d %d %d %d" % (batch.epoch, batch.step, index, len(view), zlib.crc32(view)))
            view.release()
        batch.release()
    sys.stdout.write("\n".join(out) + ("\n" if out else ""))


if __name__ == "__main__":
    main()
