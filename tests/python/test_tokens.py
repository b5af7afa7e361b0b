"""Token corpora end to end (issue 38): each format written by its reference
writer (or its published layout, where the writer does not install), served
with `ringfeed serve --seq-len L`, read back by every rank: every window equals
the reference concatenation's slice with its document starts, each exactly
once per epoch over W ranks; a resume with another world size goes on where
the first run stopped. token_corpora.py has the writers and the model."""

import numpy as np
import pytest

from token_corpora import (check_windows, concatenation, documents, megatron_core, positions, run, write_datatrove_layout,
                           write_flat, write_litdata, write_mds, write_megatron, write_megatron_layout)

L = 32
B = 4


def served_once_per_epoch(rows, n_windows, world_size, epochs=1):
    """Each epoch served every window at most once, and as many as whole steps hold."""
    for e in range(epochs):
        got = [i for r in rows if r["epoch"] == e for i in r["indices"]]
        assert len(got) == len(set(got)), "epoch %d served a window twice" % e
        assert len(got) == n_windows // (world_size * B) * world_size * B, "epoch %d served %d of %d" % (e, len(got), n_windows)
        assert all(0 <= i < n_windows for i in got)


def windows_of(stream):
    return (len(stream) - 1) // L


@pytest.fixture(scope="module")
def docs():
    return documents(160, seed=38)


def test_flat_token_files_are_cut_into_windows_of_the_concatenation(tmp_path, docs):
    # Two files (each one document) in key order, as nanoGPT's train.bin is one.
    write_flat(tmp_path / "a.bin", docs[:90])
    write_flat(tmp_path / "b.bin", docs[90:])
    flat_docs = [np.concatenate(docs[:90]), np.concatenate(docs[90:])]
    stream, starts = concatenation(flat_docs)
    rows, err = run([tmp_path], L, B, 2, "--format", "tokens", "--token-dtype", "uint16", "--epochs", "2")
    assert "2 documents" in err, err
    n = windows_of(stream)
    served_once_per_epoch(rows, n, 2, epochs=2)
    assert check_windows(rows, stream, starts, L) == 2 * (n // (2 * B)) * 2 * B


def test_an_eos_token_goes_between_documents_only_when_asked(tmp_path, docs):
    write_flat(tmp_path / "x.bin", docs[:20])
    write_flat(tmp_path / "y.bin", docs[20:40])
    flat_docs = [np.concatenate(docs[:20]), np.concatenate(docs[20:40])]
    stream, starts = concatenation(flat_docs, eos=65535)
    rows, _ = run([tmp_path], L, B, 1, "--token-dtype", "uint16", "--eos-token", "65535", "--no-shuffle")
    assert check_windows(rows, stream, starts, L) == windows_of(stream) // B * B
    assert any(65535 in r["tokens"] for r in rows)


@pytest.mark.parametrize("writer", ["megatron-core", "layout"])
def test_a_megatron_prefix_is_read_as_indexed_dataset_writes_it(tmp_path, docs, writer):
    if writer == "megatron-core" and megatron_core() is None:
        pytest.skip("megatron-core is not installed (tests/run.sh installs it)")
    prefix = tmp_path / "corpus_text_document"
    if writer == "layout":
        write_megatron_layout(prefix, docs)
    else:
        assert write_megatron(prefix, docs) == "megatron-core"
    # A sibling the prefix must not take in.
    (tmp_path / "tokenizer.json").write_text("{}")
    stream, starts = concatenation(docs)
    rows, err = run([prefix], L, B, 3)
    assert "(megatron)" in err, err
    served_once_per_epoch(rows, windows_of(stream), 3)
    assert check_windows(rows, stream, starts, L) > 0


def test_a_directory_of_megatron_pairs_is_one_corpus_in_key_order(tmp_path, docs):
    write_megatron_layout(tmp_path / "part-000", docs[:70])
    write_megatron_layout(tmp_path / "part-001", docs[70:])
    stream, starts = concatenation(docs)
    rows, _ = run([tmp_path], L, B, 2)
    served_once_per_epoch(rows, windows_of(stream), 2)
    assert check_windows(rows, stream, starts, L) > 0


def test_datatrove_files_are_read_as_tokenized_file_writes_them(tmp_path, docs):
    write_datatrove_layout(tmp_path, "000_tokenized", docs[:100], loss=True)
    write_datatrove_layout(tmp_path, "001_tokenized", docs[100:])
    stream, starts = concatenation(docs)
    rows, err = run([tmp_path], L, B, 2, "--format", "datatrove")
    assert "(datatrove)" in err, err
    served_once_per_epoch(rows, windows_of(stream), 2)
    assert check_windows(rows, stream, starts, L) > 0


def test_datatrove_uint32_tokens_are_told_by_their_size(tmp_path):
    docs32 = [np.arange(k, dtype=np.uint32) + 70000 for k in (50, 61, 33)]
    write_datatrove_layout(tmp_path, "big", docs32, dtype=np.uint32)
    stream, starts = concatenation(docs32)
    rows, err = run([tmp_path], L, 1, 1)
    assert "uint32" in err, err
    assert check_windows(rows, stream, starts, L) == windows_of(stream)


def test_litdata_optimize_output_with_tokens_loader_is_read_in_chunk_order(tmp_path, docs):
    pytest.importorskip("litdata")
    kept = write_litdata(tmp_path / "lit", docs, chunk_bytes="8KB")
    stream, starts = concatenation(kept)
    rows, err = run([tmp_path / "lit"], L, B, 2)
    assert "(litdata)" in err, err
    served_once_per_epoch(rows, windows_of(stream), 2)
    assert check_windows(rows, stream, starts, L) > 0


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_mds_shards_with_a_token_column_are_read_past_their_other_columns(tmp_path, docs, compression):
    pytest.importorskip("streaming")
    kept = write_mds(tmp_path / "mds", docs, compression=compression)
    stream, starts = concatenation(kept)
    rows, err = run([tmp_path / "mds"], L, B, 2)
    assert "(mds)" in err, err
    served_once_per_epoch(rows, windows_of(stream), 2)
    assert check_windows(rows, stream, starts, L) > 0


def corpus_of(fmt, tmp_path, docs):
    """`docs` written in format `fmt` under tmp_path: (--source, the documents held)."""
    if fmt == "megatron":
        write_megatron_layout(tmp_path / "c", docs)
        return tmp_path / "c", docs
    if fmt == "datatrove":
        write_datatrove_layout(tmp_path, "000", docs[:50])
        write_datatrove_layout(tmp_path, "001", docs[50:])
        return tmp_path, docs
    if fmt == "tokens":
        write_flat(tmp_path / "train.bin", docs)
        return tmp_path / "train.bin", [np.concatenate(docs)]
    if fmt == "litdata":
        pytest.importorskip("litdata")
        return tmp_path / "lit", write_litdata(tmp_path / "lit", docs, chunk_bytes="8KB")
    pytest.importorskip("streaming")
    return tmp_path / "mds", write_mds(tmp_path / "mds", docs)


@pytest.mark.parametrize("fmt", ["megatron", "datatrove", "tokens", "litdata", "mds"])
def test_a_resume_with_another_world_size_goes_on_with_the_same_windows(tmp_path, docs, fmt):
    prefix, held = corpus_of(fmt, tmp_path, docs)
    flags = ("--format", fmt, "--token-dtype", "uint16")
    n = windows_of(concatenation(held)[0])
    whole, _ = run([prefix], L, B, 1, "--seed", "11", *flags)
    order = positions(whole, 1, B)
    # W = 1 stopped after 5 steps (20 samples); W = 2 goes on from there.
    resumed, _ = run([prefix], L, B, 2, "--seed", "11", "--resume", "0:%d" % (5 * B), *flags)
    got = positions(resumed, 2, B, start=5 * B)
    assert got, "the resumed run served nothing"
    for key, (index, tokens, _) in got.items():
        assert order[key][0] == index, "position %s: %d after the resume, %d before" % (key, index, order[key][0])
        assert np.array_equal(order[key][1], tokens)
    served = {order[(0, p)][0] for p in range(5 * B)} | {v[0] for v in got.values()}
    assert len(served) == 5 * B + len(got) and len(served) > n - 3 * B
    stream, starts = concatenation(held)
    assert check_windows(resumed, stream, starts, L) == len(got)


def test_document_starts_make_flash_attention_boundaries(tmp_path):
    # Documents of 5, 3 and 40 tokens: window 0 (L = 8) starts docs at 0 and 5.
    docs = [np.arange(5, dtype=np.uint16), np.arange(3, dtype=np.uint16) + 100, np.arange(40, dtype=np.uint16) + 200]
    write_megatron_layout(tmp_path / "c", docs)
    rows, _ = run([tmp_path / "c"], 8, 2, 1, "--no-shuffle")
    first = min(rows, key=lambda r: r["step"])
    assert first["starts"][0] == [0, 5, 8]  # tokens 0..9: the third document starts at 8
    assert first["starts"][1] == [0]  # window 1 = tokens 8..17: the third document starts at its 0
    # The inputs are the first 8 tokens of each window: cut at 5, then each
    # window's end (window 1 starts a document at 0, which is its start).
    assert first["cu_seqlens"].tolist() == [0, 5, 8, 16]


def test_a_window_with_more_document_starts_than_room_keeps_the_count_and_says_so(tmp_path):
    docs = [np.array([i, i], dtype=np.uint16) for i in range(40)]
    write_megatron_layout(tmp_path / "c", docs)
    rows, err = run([tmp_path / "c"], 16, 1, 1, "--no-shuffle", "--max-doc-starts", "3")
    assert rows[0]["counts"][0] == 9  # tokens 0..16: documents at 0, 2, ..., 16
    assert rows[0]["starts"][0] == [0, 2, 4]
    assert "--max-doc-starts" in err, err


def test_the_torch_loader_gives_windows_in_their_dtype_or_int64_with_varlen_boundaries(tmp_path):
    torch = pytest.importorskip("torch")
    import ringfeed
    import ringfeed.torch
    from token_corpora import name, serve

    docs = [np.arange(k, dtype=np.uint16) + 1000 * i for i, k in enumerate((7, 30, 3, 50, 12))]
    write_megatron_layout(tmp_path / "c", docs)
    stream, starts = concatenation(docs)
    for kwargs in ({}, {"token_dtype": torch.int64, "cu_seqlens": True}):
        loader = name("torch")
        p = serve([tmp_path / "c"], loader, 16, 2, 1, "--no-shuffle")
        try:
            with ringfeed.torch.Loader(ringfeed.attach(loader, 0, timeout=30), **kwargs) as it:
                for out in it:
                    tokens = out if not kwargs else out.tokens
                    assert tokens.dtype == (torch.int64 if kwargs else torch.uint16)
                    assert tokens.shape == (2, 17)
                    first = it.indices[0] * 16
                    assert np.array_equal(tokens[0].to(torch.int64).numpy(), stream[first:first + 17].astype(np.int64))
                    if kwargs:
                        cu = out.cu_seqlens.tolist()
                        assert cu[0] == 0 and cu[-1] == 32 and out.cu_seqlens.dtype == torch.int32
                        # A cut at every document start inside a window's 16 inputs.
                        for w in range(2):
                            v0 = int(it.indices[w]) * 16
                            inside = [s - v0 + 16 * w for s in starts if v0 < s < v0 + 16]
                            assert set(inside) <= set(cu)
                        assert out.max_seqlen == max(b - a for a, b in zip(cu, cu[1:]))
                    del out, tokens
            assert p.wait(timeout=30) == 0
        finally:
            p.kill()
            p.wait()


# ------------------------------------------------------------------ mixtures


def corpus_counts(indices, first_of_b):
    a = sum(1 for i in indices if i < first_of_b)
    return a, len(indices) - a


def within_one(counts, weights, total):
    share = [w / sum(weights) * total for w in weights]
    return all(abs(c - s) < 1 for c, s in zip(counts, share)), share


@pytest.fixture(scope="module")
def two_corpora(tmp_path_factory, docs):
    """A Megatron prefix and a datatrove directory: two formats, one mixture."""
    root = tmp_path_factory.mktemp("mix")
    write_megatron_layout(root / "web", docs[:100])
    (root / "books").mkdir()
    write_datatrove_layout(root / "books", "000", docs[100:])
    a, _ = concatenation(docs[:100])
    b, _ = concatenation(docs[100:])
    return root, (root / "web", root / "books"), (a, b)


def test_a_mixture_draws_each_source_within_one_sample_of_its_weight_whatever_the_world_size(two_corpora, docs):
    _, sources, (a, b) = two_corpora
    na, nb = windows_of(a), windows_of(b)
    weights = (0.7, 0.3)
    runs = {}
    for w in (1, 3):
        rows, err = run(sources, L, B, w, "--weights", "0.7,0.3", "--seed", "4")
        order = positions(rows, w, B)
        indices = [order[(0, p)][0] for p in range(len(order))]
        ok, share = within_one(corpus_counts(indices, na), weights, len(indices))
        assert ok, "W=%d: %s for %s" % (w, corpus_counts(indices, na), share)
        # Every prefix too (the interleave's promise), and no window twice.
        for p in range(1, len(indices) + 1, 7):
            assert within_one(corpus_counts(indices[:p], na), weights, p)[0], "prefix %d" % p
        assert len(set(indices)) == len(indices)
        # Each window is its own corpus's slice.
        stream_a, starts_a = concatenation(docs[:100])
        stream_b, starts_b = concatenation(docs[100:])
        assert check_windows(rows, stream_a, starts_a, L, base=0, count=na) > 0
        assert check_windows(rows, stream_b, starts_b, L, base=na, count=nb) > 0
        runs[w] = indices
    # The default epoch repeats no window: 0.7 N <= na and 0.3 N <= nb.
    n = min(int(na / 0.7), int(nb / 0.3))
    assert abs(len(runs[1]) - (n // B) * B) <= B
    # The same order whatever the world size (W=3 drops a longer tail).
    common = min(len(runs[1]), len(runs[3]))
    assert runs[1][:common] == runs[3][:common]


def test_a_mixture_resumed_mid_epoch_with_another_world_size_keeps_the_proportions(two_corpora):
    _, sources, (a, _) = two_corpora
    na = windows_of(a)
    first, _ = run(sources, L, B, 1, "--weights", "0.7,0.3", "--seed", "9")
    before = positions(first, 1, B)
    s = 6 * B  # W=1 stopped after 6 steps
    rows, _ = run(sources, L, B, 3, "--weights", "0.7,0.3", "--seed", "9", "--resume", "0:%d" % s)
    after = positions(rows, 3, B, start=s)
    indices = [before[(0, p)][0] for p in range(s)] + [after[(0, p)][0] for p in range(s, s + len(after))]
    ok, share = within_one(corpus_counts(indices, na), (0.7, 0.3), len(indices))
    assert ok, "%s for %s" % (corpus_counts(indices, na), share)
    for p in range(s, s + len(after)):
        assert after[(0, p)][0] == before[(0, p)][0], "position %d" % p


def test_more_samples_per_epoch_than_a_source_holds_shuffle_it_again_for_each_pass(two_corpora):
    _, sources, (a, b) = two_corpora
    na, nb = windows_of(a), windows_of(b)
    total = 4 * (na + nb) // B * B
    rows, _ = run(sources, L, B, 2, "--weights", "1,1", "--samples-per-epoch", str(total), "--seed", "2")
    order = positions(rows, 2, B)
    indices = [order[(0, p)][0] for p in range(len(order))]
    firsts = [i for i in indices if i < na]
    # Whole passes over the first source are permutations of its windows, each a new one.
    passes = [firsts[k * na:(k + 1) * na] for k in range(len(firsts) // na)]
    assert len(passes) >= 2
    for p in passes:
        assert sorted(p) == list(range(na))
    assert passes[0] != passes[1]
