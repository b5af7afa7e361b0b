"""A Python trainer for the end-to-end tests: prints one line per sample,
"epoch step index len crc32", like tests/c/dump_hashes.c."""
import sys
import zlib

import ringfeed


def main():
    # "env": the rank comes from LOCAL_RANK, as under torchrun.
    name, rank = sys.argv[1], None if sys.argv[2] == "env" else int(sys.argv[2])
    feed = ringfeed.attach(name=name, rank=rank, timeout=30)
    out = []
    for batch in feed:
        for i, index in enumerate(batch.indices.tolist()):
            view = batch.sample(i)
            out.append("%d %d %d %d %d" % (batch.epoch, batch.step, index, len(view), zlib.crc32(view)))
            view.release()
        batch.release()
    sys.stdout.write("\n".join(out) + ("\n" if out else ""))


if __name__ == "__main__":
    main()
