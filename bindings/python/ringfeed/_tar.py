"""The fields of a WebDataset tar sample, viewed in place.

A sample served from tar shards (``ringfeed serve --format tar``) is the raw
tar bytes of its members: each member's header blocks (ustar, pax extended
headers, GNU long names) then its data, up to the last member's last data
byte (docs/shards.md). ``tar_fields`` walks those headers and returns one
zero-copy memoryview per member's data, keyed by its field name: the
extension lowercased, as ``webdataset.WebDataset`` names fields by default
(``000123.seg.png`` -> ``"seg.png"``, ``s1.JPG`` -> ``"jpg"``).
``tar_members`` gives each member's name as stored. Only the 512-byte
headers are read; no data byte is copied.
"""

_BLOCK = 512


class TarFieldError(ValueError):
    """A sample's bytes are not well-formed tar members."""


def _octal(field, what, at):
    if field and field[0] & 0x80:
        if field[0] & 0x40:
            raise TarFieldError("the %s field of the header at byte %d is negative" % (what, at))
        value = field[0] & 0x3F
        for b in field[1:]:
            value = value * 256 + b
        return value
    digits = field.lstrip(b" ").split(b"\0", 1)[0].split(b" ", 1)[0]
    try:
        return int(digits, 8)
    except ValueError:
        raise TarFieldError("the %s field of the header at byte %d is not a number: %r" % (what, at, bytes(field))) from None


def _check_sum(header, at):
    stored = _octal(header[148:156], "checksum", at)
    unsigned = sum(header) - sum(header[148:156]) + 8 * 0x20
    if stored == unsigned:
        return
    signed = sum(b - 256 if b > 127 else b for b in header) - sum(b - 256 if b > 127 else b for b in header[148:156]) + 8 * 0x20
    if stored != signed:
        raise TarFieldError("bad header checksum at byte %d: the header says %d, its bytes sum to %d" % (at, stored, unsigned))


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
            raise TarFieldError("malformed pax header at byte %d" % at) from None
        if space < 0 or length <= space + 1 or length > len(data) or data[length - 1 : length] != b"\n":
            raise TarFieldError("malformed pax header at byte %d" % at)
        key, _, value = data[space + 1 : length - 1].partition(b"=")
        if key == b"path":
            path = value
        elif key == b"size":
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


def tar_members(sample):
    """Yield ``(name, view)`` for each regular-file member of ``sample`` (a
    bytes-like object holding whole tar members), ``name`` as bytes and
    ``view`` a zero-copy memoryview of its data. Raises TarFieldError naming
    the byte offset when the bytes are not tar members."""
    mv = memoryview(sample).cast("B")
    n = len(mv)
    pos = 0
    path = size_override = None
    while pos < n:
        if pos + _BLOCK > n:
            raise TarFieldError("the sample ends inside a header at byte %d (it is %d bytes)" % (pos, n))
        header = bytes(mv[pos : pos + _BLOCK])  # 512 bytes of metadata, not data
        if not header.strip(b"\0"):
            raise TarFieldError("an end-of-archive block at byte %d inside a sample" % pos)
        _check_sum(header, pos)
        typeflag = header[156:157]
        size = _octal(header[124:136], "size", pos)
        data = pos + _BLOCK
        if typeflag in (b"x", b"L", b"K", b"g"):
            if data + size > n:
                raise TarFieldError("the header at byte %d runs past the sample's end" % pos)
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
                raise TarFieldError("member %r at byte %d (%d bytes) runs past the sample's end (%d bytes)" % (name, pos, size, n))
            yield name, mv[data : data + size]
        pos = data + -(-size // _BLOCK) * _BLOCK


def tar_fields(sample, lowercase=True):
    """``{field: memoryview}`` of a tar sample's members (see ``tar_members``):
    ``000123.jpg`` and ``000123.cls`` give ``{"jpg": ..., "cls": ...}``.
    The field is the extension lowercased (``s1.JPG`` -> ``"jpg"``), as
    WebDataset's default ``group_by_keys(lcase=True)`` names it;
    ``lowercase=False`` keeps the extension as stored, and ``tar_members``
    gives each member's full name. Field names are str (UTF-8, undecodable
    bytes kept as surrogates); a repeated field is a TarFieldError."""
    fields = {}
    for name, view in tar_members(sample):
        ext = split_key(name)[1].decode("utf-8", "surrogateescape")
        if lowercase:
            ext = ext.lower()
        if ext in fields:
            raise TarFieldError(
                "extension %r appears twice in the sample (member %r)%s"
                % (ext, name, "; extensions are compared lowercased, as WebDataset does" if lowercase else "")
            )
        fields[ext] = view
    return fields


def tar_key(sample):
    """The sample's key (``b"a/b/000123"``): its first member's name before the
    extension; None when it holds no regular-file member."""
    for name, _ in tar_members(sample):
        return split_key(name)[0].decode("utf-8", "surrogateescape")
    return None
