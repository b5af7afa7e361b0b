"""ringfeed.tar.fields on tar bytes made by Python's tarfile in each format:
every field's view has its member's bytes, views are slices of the buffer
(no copy), and bytes that are not whole tar members raise ringfeed.tar.FieldError
naming the offset."""
import io
import tarfile

import numpy as np
import pytest

import ringfeed
import ringfeed.tar

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
    fields = ringfeed.tar.fields(buf)
    assert {ext: bytes(v) for ext, v in fields.items()} == {"jpg": members[0][1], "cls": b"", "seg.png": members[2][1]}
    assert ringfeed.tar.key(buf) == LONG
    # Zero-copy: writing through the buffer shows in the view.
    view = fields["jpg"]
    assert view.obj is not None
    start = bytes(buf).index(members[0][1])
    buf[start] ^= 0xFF
    assert view[0] == members[0][1][0] ^ 0xFF
    assert np.frombuffer(fields["seg.png"], np.uint8)[:4].tobytes() == b"\x89PNG"


def test_a_cut_sample_names_the_offset_of_the_member_it_cuts():
    buf = sample_bytes(tarfile.USTAR_FORMAT, [("a.jpg", b"x" * 600), ("a.cls", b"1")])
    with pytest.raises(ringfeed.tar.FieldError, match="at byte 1536"):
        ringfeed.tar.fields(buf[:-1])
    with pytest.raises(ringfeed.tar.FieldError, match="ends inside a header at byte 1536"):
        ringfeed.tar.fields(buf[:1600])


def test_a_damaged_header_is_a_checksum_error():
    buf = sample_bytes(tarfile.USTAR_FORMAT, [("a.jpg", b"x"), ("a.cls", b"1")])
    buf[512 * 2 + 1] ^= 1
    with pytest.raises(ringfeed.tar.FieldError, match="checksum at byte 1024"):
        ringfeed.tar.fields(buf)


def test_a_repeated_extension_is_refused():
    buf = sample_bytes(tarfile.USTAR_FORMAT, [("a.jpg", b"x"), ("a.jpg", b"y")])
    with pytest.raises(ringfeed.tar.FieldError, match="'jpg' appears twice"):
        ringfeed.tar.fields(buf)


def test_keys_split_the_webdataset_way():
    assert ringfeed.tar.split_key(b"a/b/000123.seg.png") == (b"a/b/000123", b"seg.png")
    assert ringfeed.tar.split_key(b"a/.hidden.txt") == (b"a/.hidden", b"txt")
    assert ringfeed.tar.split_key(b"README") == (b"README", b"")


def test_field_names_are_lowercased_as_webdataset_names_them_and_the_stored_name_stays_reachable():
    buf = sample_bytes(tarfile.USTAR_FORMAT, [("k/s1.JPG", b"jpeg"), ("k/s1.Seg.PNG", b"png"), ("k/s1.cls", b"7")])
    fields = ringfeed.tar.fields(buf)
    assert {f: bytes(v) for f, v in fields.items()} == {"jpg": b"jpeg", "seg.png": b"png", "cls": b"7"}
    assert set(ringfeed.tar.fields(buf, lowercase=False)) == {"JPG", "Seg.PNG", "cls"}
    assert [name for name, _ in ringfeed.tar.members(buf)] == [b"k/s1.JPG", b"k/s1.Seg.PNG", b"k/s1.cls"]
    assert ringfeed.tar.key(buf) == "k/s1"


def test_extensions_differing_only_in_case_are_one_field_as_in_webdataset():
    buf = sample_bytes(tarfile.USTAR_FORMAT, [("a.jpg", b"x"), ("a.JPG", b"y")])
    with pytest.raises(ringfeed.tar.FieldError, match="'jpg' appears twice.*lowercased"):
        ringfeed.tar.fields(buf)
    assert set(ringfeed.tar.fields(buf, lowercase=False)) == {"jpg", "JPG"}


def test_field_names_match_webdatasets_default_grouping():
    """The rule webdataset 1.0.2's group_by_keys(lcase=True) applies, written
    out here (webdataset itself is not installed): base_plus_ext, then
    suffix.lower()."""
    import re

    def webdataset_field(name):
        match = re.match(r"^((?:.*/|)[^.]+)[.]([^/]*)$", name)
        return match.group(2).lower()

    for name in ["k/s1.JPG", "a/b/000123.Seg.PNG", "v1.2/x/000001.Json", "x.ÉTÉ"]:
        buf = sample_bytes(tarfile.PAX_FORMAT, [(name, b"d")])
        assert list(ringfeed.tar.fields(buf)) == [webdataset_field(name)], name


def test_the_tar_helpers_old_top_level_names_are_aliases_outside_all():
    # Before ringfeed.tar they were ringfeed.tar_fields & co, in __all__: kept
    # for a release, but `from ringfeed import *` no longer brings them.
    assert ringfeed.tar_fields is ringfeed.tar.fields
    assert ringfeed.tar_key is ringfeed.tar.key
    assert ringfeed.tar_members is ringfeed.tar.members
    assert ringfeed.TarFieldError is ringfeed.tar.FieldError
    names = {}
    exec("from ringfeed import *", names)
    assert not {"tar_fields", "tar_key", "tar_members", "TarFieldError", "tar"} & set(names)
    assert set(ringfeed.tar.__all__) == {"FieldError", "fields", "key", "members", "split_key"}
