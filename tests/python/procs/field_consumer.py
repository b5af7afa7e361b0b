"""A Python trainer for the pack tests: prints one line per sample,
"epoch step index crc32", where the bytes are the sample's own (`raw`: a
tree of one file per sample) or, for a tar shard's sample (`tar`), its one
field's content, parsed from the raw tar bytes the slot holds (TAR-INDEX.md:
header blocks, pax records, data)."""
import sys
import zlib

import ringfeed

BLOCK = 512


def tar_fields(data):
    """(name, content) of every member in a sample's tar bytes."""
    fields, at, pax = [], 0, {}
    while at < len(data):
        header = bytes(data[at:at + BLOCK])
        size = int(header[124:136].rstrip(b"\0 ") or b"0", 8)
        kind = header[156:157]
        body = at + BLOCK
        if kind == b"x":
            records = bytes(data[body:body + size])
            while records:
                length = int(records.split(b" ", 1)[0])
                key, _, value = records[:length].split(b" ", 1)[1].rstrip(b"\n").partition(b"=")
                pax[key] = value
                records = records[length:]
        else:
            name = pax.get(b"path", header[:100].rstrip(b"\0"))
            size = int(pax.get(b"size", size))
            fields.append((name, bytes(data[body:body + size])))
            pax = {}
        at = body + (size + BLOCK - 1) // BLOCK * BLOCK
    return fields


def main():
    name, rank, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    feed = ringfeed.attach(name=name, rank=rank, timeout=30)
    out = []
    for batch in feed:
        for i, index in enumerate(batch.indices.tolist()):
            view = batch.sample(i)
            if mode == "tar":
                fields = tar_fields(view)
                assert len(fields) == 1, fields
                data = fields[0][1]
            else:
                data = bytes(view)
            out.append("%d %d %d %d" % (batch.epoch, batch.step, index, zlib.crc32(data)))
            view.release()
        batch.release()
    sys.stdout.write("\n".join(out) + ("\n" if out else ""))


if __name__ == "__main__":
    main()
