"""ringfeed.tar_fields on tar bytes made by Python's tarfile in each format:
every field's view has its member's bytes, views are slices of the buffer
(no copy), and bytes that are not whole tar members raise TarFieldError
naming the offset."""
import io
import tarfile

import numpy as np
import pytest

import ringfeed

LONG = "k/" + "d" * 120 + "/000007"


def sample_bytes(fmt, members):
    """A tar of `members` [(name, data)], cut after the last member's data
    (as the loader serves a sample)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    last = tarfile.open(fileobj=io.BytesIO(raw)).getmembers()[-1]
    return bytearray(raw[: last.offset_data + last.size])


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
def test_every_field_is_a_view_of_its_members_bytes(fmt):
    members = [(LONG + ".jpg", bytes(range(256)) * 3), (LONG + ".cls", b""), (LONG + ".seg.png", b"\x89PNG" * 200)]
    buf = sample_bytes(fmt, members)
    fields = ringfeed.tar_fields(buf)
    assert {ext: bytes(v) for ext, v in fields.items()} == {"jpg": members[0][1], "cls": b"", "seg.png": members[2][1]}
    assert ringfeed.tar_key(buf) == LONG
    # Zero-copy: writing through the buffer shows in the view.
    view = fields["jpg"]
    assert view.obj is not None
    start = bytes(buf).index(members[0][1])
    buf[start] ^= 0xFF
    assert view[0] == members[0][1][0] ^ 0xFF
    assert np.frombuffer(fields["seg.png"], np.uint8)[:4].tobytes() == b"\x89PNG"


def test_a_cut_sample_names_the_offset_of_the_member_it_cuts():
    buf = sample_bytes(tarfile.USTAR_FORMAT, [("a.jpg", b"x" * 600), ("a.cls", b"1")])
    with pytest.raises(ringfeed.TarFieldError, match="at byte 1536"):
        ringfeed.tar_fields(buf[:-1])
    with pytest.raises(ringfeed.TarFieldError, match="ends inside a header at byte 1536"):
        ringfeed.tar_fields(buf[:1600])


def test_a_damaged_header_is_a_checksum_error():
    buf = sample_bytes(tarfile.USTAR_FORMAT, [("a.jpg", b"x"), ("a.cls", b"1")])
    buf[512 * 2 + 1] ^= 1
    with pytest.raises(ringfeed.TarFieldError, match="checksum at byte 1024"):
        ringfeed.tar_fields(buf)


def test_a_repeated_extension_is_refused():
    buf = sample_bytes(tarfile.USTAR_FORMAT, [("a.jpg", b"x"), ("a.jpg", b"y")])
    with pytest.raises(ringfeed.TarFieldError, match="'jpg' appears twice"):
        ringfeed.tar_fields(buf)


def test_keys_split_the_webdataset_way():
    assert ringfeed._tar.split_key(b"a/b/000123.seg.png") == (b"a/b/000123", b"seg.png")
    assert ringfeed._tar.split_key(b"a/.hidden.txt") == (b"a/.hidden", b"txt")
    assert ringfeed._tar.split_key(b"README") == (b"README", b"")
