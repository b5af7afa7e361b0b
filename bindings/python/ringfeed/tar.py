"""ringfeed.tar: the fields of a WebDataset tar sample, viewed in place.

A sample served from tar shards (``ringfeed serve --format tar``) is the raw
tar bytes of its members: each member's header blocks (ustar, pax extended
headers, GNU long names) then its data, up to the last member's last data
byte (docs/shards.md). ``fields`` walks those headers and returns one
zero-copy memoryview per member's data, keyed by its field name: the
extension lowercased, as ``webdataset.WebDataset`` names fields by default
(``000123.seg.png`` -> ``"seg.png"``, ``s1.JPG`` -> ``"jpg"``).
``members`` gives each member's name as stored, ``key`` the sample's key.
Only the 512-byte headers are read; no data byte is copied::

    import ringfeed.tar

    f = ringfeed.tar.fields(batch.sample(i))      # {"jpg": memoryview, "cls": ...}

(``batch.fields(i)`` and ``batch.key(i)`` are the same on a batch's sample.)
Before this submodule these were ``ringfeed.tar_fields``, ``tar_key``,
``tar_members`` and ``TarFieldError``: those names stay as aliases for a
release.
"""

__all__ = ["FieldError", "fields", "key", "members", "split_key"]

_BLOCK = 512


class FieldError(ValueError):
    """A sample's bytes are not well-formed tar members (``ringfeed.FieldError`` before)."""


def _octal(field, what, at):
    if field and field[0] & 0x80:
        if field[0] & 0x40:
            raise FieldError("the %s field of the header at byte %d is negative" % (what, at))
        value = field[0] & 0x3F
        for b in field[1:]:
            value = value * 256 + b
        return value
    digits = field.lstrip(b" ").split(b"\0", 1)[0].split(b" ", 1)[0]
    try:
        return int(digits, 8)
    except ValueError:
        raise FieldError("the %s field of the header at byte %d is not a number: %r" % (what, at, bytes(field))) from None


def _check_sum(header, at):
    stored = _octal(header[148:156], "checksum", at)
    unsigned = sum(header) - sum(header[148:156]) + 8 * 0x20
    if stored == unsigned:
        return
    signed = sum(b - 256 if b > 127 else b for b in header) - sum(b - 256 if b > 127 else b for b in header[148:156]) + 8 * 0x20
    if stored != signed:
        raise FieldError("bad header checksum at byte %d: the header says %d, its bytes sum to %d" % (at, stored, unsigned))


def _ustar_name(header):
    name = header[0:100].split(b"\0", 1)[0]
    if header[257:263] == b"ustar\0":
        prefix = header[345:500].split(b"\0", 1)[0]
        if prefix:
            return prefix + b"/" + name
    return name


def _pax(data, at):
    path = size = None
    while data and data.strip(b"\0"):
        space = data.find(b" ")
        try:
            length = int(data[:space])
        except ValueError:
            raise FieldError("malformed pax header at byte %d" % at) from None
        if space < 0 or length <= space + 1 or length > len(data) or data[length - 1 : length] != b"\n":
            raise FieldError("malformed pax header at byte %d" % at)
        name, _, value = data[space + 1 : length - 1].partition(b"=")
        if name == b"path":
            path = value
        elif name == b"size":
            size = int(value)
        data = data[length:]
    return path, size


def split_key(name):
    """``(key, ext)`` of a member name as bytes, the WebDataset way: the key
    is everything up to the first '.' of the last path component that is not
    its first character."""
    start = name.rfind(b"/") + 1
    dot = name.find(b".", start + 1)
    if dot < 0:
        return name, b""
    return name[:dot], name[dot + 1 :]


def members(sample):
    """Yield ``(name, view)`` for each regular-file member of ``sample`` (a
    bytes-like object holding whole tar members), ``name`` as bytes and
    ``view`` a zero-copy memoryview of its data. Raises FieldError naming
    the byte offset when the bytes are not tar members."""
    mv = memoryview(sample).cast("B")
    n = len(mv)
    pos = 0
    path = size_override = None
    while pos < n:
        if pos + _BLOCK > n:
            raise FieldError("the sample ends inside a header at byte %d (it is %d bytes)" % (pos, n))
        header = bytes(mv[pos : pos + _BLOCK])  # 512 bytes of metadata, not data
        if not header.strip(b"\0"):
            raise FieldError("an end-of-archive block at byte %d inside a sample" % pos)
        _check_sum(header, pos)
        typeflag = header[156:157]
        size = _octal(header[124:136], "size", pos)
        data = pos + _BLOCK
        if typeflag in (b"x", b"L", b"K", b"g"):
            if data + size > n:
                raise FieldError("the header at byte %d runs past the sample's end" % pos)
            if typeflag == b"x":
                path, size_override = _pax(bytes(mv[data : data + size]), pos)
            elif typeflag == b"L":
                path = bytes(mv[data : data + size]).split(b"\0", 1)[0]
            pos = data + -(-size // _BLOCK) * _BLOCK
            continue
        if size_override is not None:
            size = size_override
        name = path if path is not None else _ustar_name(header)
        path = size_override = None
        if typeflag in (b"0", b"\0", b"7"):
            if data + size > n:
                raise FieldError("member %r at byte %d (%d bytes) runs past the sample's end (%d bytes)" % (name, pos, size, n))
            yield name, mv[data : data + size]
        pos = data + -(-size // _BLOCK) * _BLOCK


def fields(sample, lowercase=True):
    """``{field: memoryview}`` of a tar sample's members (see ``members``):
    ``000123.jpg`` and ``000123.cls`` give ``{"jpg": ..., "cls": ...}``.
    The field is the extension lowercased (``s1.JPG`` -> ``"jpg"``), as
    WebDataset's default ``group_by_keys(lcase=True)`` names it;
    ``lowercase=False`` keeps the extension as stored, and ``members``
    gives each member's full name. Field names are str (UTF-8, undecodable
    bytes kept as surrogates); a repeated field is a FieldError."""
    out = {}
    for name, view in members(sample):
        ext = split_key(name)[1].decode("utf-8", "surrogateescape")
        if lowercase:
            ext = ext.lower()
        if ext in out:
            raise FieldError(
                "extension %r appears twice in the sample (member %r)%s"
                % (ext, name, "; extensions are compared lowercased, as WebDataset does" if lowercase else "")
            )
        out[ext] = view
    return out


def key(sample):
    """The sample's key (``"a/b/000123"``): its first member's name before the
    extension; None when it holds no regular-file member."""
    for name, _ in members(sample):
        return split_key(name)[0].decode("utf-8", "surrogateescape")
    return None
