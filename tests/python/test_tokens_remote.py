"""Token corpora on remote stores (issue 38): the same corpora as the local
tests, served from nginx (http://) and s3s-fs (s3://), read through the same
readers, data cache and retries as every remote source: every window equals the
reference concatenation's slice, each once per epoch; a Megatron PREFIX names
its pair without a listing; a resume from W=1 to W=2; a mixture of a local and
a remote corpus; the block order through the chunk layer and the data cache."""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from test_remote_serve import SERVERS, start_server, state_dir  # noqa: F401  (the module's server fixture)
from token_corpora import (check_windows, concatenation, documents, positions, run, write_datatrove_layout, write_litdata,
                           write_mds, write_megatron_layout)

L = 32
B = 4


def windows_of(stream):
    return (len(stream) - 1) // L


@pytest.fixture(scope="module")
def docs():
    return documents(120, seed=83)


@pytest.fixture(scope="module")
def corpora(tmp_path_factory, docs):
    """Local copies of every format, and the documents each holds."""
    root = tmp_path_factory.mktemp("tokens")
    (root / "meg").mkdir()
    write_megatron_layout(root / "meg" / "corpus_text_document", docs)
    (root / "dt").mkdir()
    write_datatrove_layout(root / "dt", "000", docs[:60])
    write_datatrove_layout(root / "dt", "001", docs[60:])
    held = {"meg": docs, "dt": docs}
    if _has("litdata"):
        held["lit"] = write_litdata(root / "lit", docs, chunk_bytes="8KB")
    if _has("streaming"):
        held["mds"] = write_mds(root / "mds", docs, compression="zstd")
        held["mdsraw"] = write_mds(root / "mdsraw", docs)
    return root, held


def _has(module):
    try:
        __import__(module)
        return True
    except ImportError:
        return False


@pytest.fixture(scope="module")
def nginx(state_dir, corpora):  # noqa: F811
    env = start_server(state_dir, "nginx")
    root, _ = corpora
    dest = os.path.join(env["RINGFEED_TEST_NGINX_ROOT"], "tok")
    shutil.copytree(root, dest)
    return env["RINGFEED_TEST_NGINX_URL"].rstrip("/") + "/tok/", env


def remote_run(sources, world_size, env, *flags):
    old = dict(os.environ)
    os.environ.update(env)
    try:
        return run(sources, L, B, world_size, *flags)
    finally:
        os.environ.clear()
        os.environ.update(old)


@pytest.mark.parametrize("fmt,path,key", [("megatron", "meg/corpus_text_document", "meg"), ("datatrove", "dt/", "dt"),
                                          ("litdata", "lit/", "lit"), ("mds", "mdsraw/", "mdsraw"), ("mds", "mds/", "mds")])
def test_every_format_served_over_http_gives_the_windows_of_its_concatenation(nginx, corpora, fmt, path, key):
    base, env = nginx
    _, held = corpora
    if key not in held:
        pytest.skip("the writer of %s is not installed" % fmt)
    stream, starts = concatenation(held[key])
    rows, err = remote_run([base + path], 2, env, "--epochs", "2")
    assert "(%s)" % fmt in err, err
    # zstd shards are read from their decompressed copies, on local disk.
    assert ("reader io_uring" in err or "reader pread" in err) if key == "mds" else "reader remote" in err, err
    for e in (0, 1):
        got = [i for r in rows if r["epoch"] == e for i in r["indices"]]
        assert len(got) == len(set(got)) == windows_of(stream) // (2 * B) * 2 * B
    assert check_windows(rows, stream, starts, L) == 2 * (windows_of(stream) // (2 * B)) * 2 * B


def test_a_remote_resume_from_one_rank_to_two_goes_on_with_the_same_windows(nginx, corpora):
    base, env = nginx
    source = base + "meg/corpus_text_document"
    whole, _ = remote_run([source], 1, env, "--seed", "3")
    before = positions(whole, 1, B)
    s = 7 * B
    rows, _ = remote_run([source], 2, env, "--seed", "3", "--resume", "0:%d" % s)
    after = positions(rows, 2, B, start=s)
    assert after
    for key, (index, tokens, _) in after.items():
        assert before[key][0] == index and np.array_equal(before[key][1], tokens)


def test_a_mixture_of_a_local_and_a_remote_corpus_reads_each_where_it_is(nginx, corpora, docs):
    base, env = nginx
    root, _ = corpora
    rows, err = remote_run([root / "dt", base + "meg/corpus_text_document"], 2, env, "--weights", "1,3", "--seed", "8")
    assert "reader mixed" in err, err
    stream, starts = concatenation(docs)
    n = windows_of(stream)
    both = check_windows(rows, stream, starts, L, base=0, count=n) + check_windows(rows, stream, starts, L, base=n, count=n)
    served = sum(len(r["indices"]) for r in rows)
    assert both == served
    remote = sum(1 for r in rows for i in r["indices"] if i >= n)
    assert abs(remote - 0.75 * served) < 1, (remote, served)


def test_the_block_order_reads_a_remote_corpus_in_chunks_kept_by_the_data_cache(nginx, corpora, docs, tmp_path):
    base, env = nginx
    source = base + "meg/corpus_text_document"
    stream, starts = concatenation(docs)
    # (A cache of more than the corpus: its chunks overlap by a token.)
    flags = ("--shuffle", "block", "--shuffle-block", "8", "--shuffle-window", "2", "--cache-dir", str(tmp_path), "--cache-size", "1M",
             "--epochs", "2")
    rows, err = remote_run([source], 2, env, *flags)
    assert check_windows(rows, stream, starts, L) == 2 * (windows_of(stream) // (2 * B)) * 2 * B
    # A GET per block of 8 windows (and a few for the tails), not one per window.
    gets = int(err.split("ringfeed: remote: ")[1].split(" requests")[0])
    assert gets < windows_of(stream) // 4, err
    # The second run reads every chunk from the disk cache.
    rows, err = remote_run([source], 2, env, *flags)
    assert check_windows(rows, stream, starts, L) > 0
    assert ", 0 misses" in err, err


@pytest.fixture(scope="module")
def s3(state_dir, corpora):  # noqa: F811
    env = start_server(state_dir, "s3")
    root, _ = corpora
    seeded = subprocess.run([sys.executable, str(SERVERS / "seed.py"), "s3", "rftokens", str(root / "meg"), "--prefix", "meg/"],
                            env=dict(os.environ, **env), capture_output=True, text=True, timeout=120)
    assert seeded.returncode == 0, seeded.stderr
    return env


def test_a_megatron_prefix_on_s3_is_read_without_listing_its_bucket(s3, docs):
    stream, starts = concatenation(docs)
    rows, err = remote_run(["s3://rftokens/meg/corpus_text_document"], 2, s3)
    assert "(megatron)" in err, err
    assert check_windows(rows, stream, starts, L) == windows_of(stream) // (2 * B) * 2 * B
