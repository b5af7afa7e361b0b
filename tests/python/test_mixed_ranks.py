"""Exactly once, zero copy, four languages at once: one loader, W=4 ranks —
two Python trainers, one C trainer, one Rust trainer — 10,000 batches each.
Every batch must arrive once, at its rank, in order, with its bytes intact;
the Python side checks its numpy views lie inside the shared mapping and
that torch.from_numpy shares that memory."""
import subprocess
import uuid

import pytest

from e2e_util import compile_c, python_consumer, ringfeed_bin, wait_all

BATCHES = 10_000
WORLD, BATCH, SAMPLE = 4, 4, 256


@pytest.fixture(scope="module")
def c_consumer(tmp_path_factory):
    return compile_c("consumer.c", tmp_path_factory.mktemp("cbin"))


def test_four_trainers_in_three_languages_get_every_batch_once_in_order(c_consumer):
    pytest.importorskip("torch")
    name = "mixed-%s" % uuid.uuid4().hex[:8]
    geometry = ["--world-size", str(WORLD), "--batch-size", str(BATCH), "--sample-bytes", str(SAMPLE)]
    loader = subprocess.Popen([ringfeed_bin(), "ring-test-producer", "--name", name, "--batches", str(BATCHES)] + geometry,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    args = [str(WORLD), str(BATCH), str(SAMPLE)]
    procs = [
        subprocess.Popen(python_consumer("pattern_consumer.py", name, 0, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE),
        subprocess.Popen(python_consumer("pattern_consumer.py", name, 1, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE),
        subprocess.Popen([c_consumer, name, "2"] + args + [str(BATCHES)], stdout=subprocess.PIPE, stderr=subprocess.PIPE),
        subprocess.Popen([ringfeed_bin(), "ring-test-consumer", "--name", name, "--rank", "3", "--expect-batches", str(BATCHES)] + geometry,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE),
    ]
    results = wait_all(procs, timeout=300)
    out, err = loader.communicate(timeout=30)
    for rank, (rc, out_r, err_r) in enumerate(results):
        assert rc == 0, "rank %d: %s %s" % (rank, out_r.decode(), err_r.decode())
    assert loader.returncode == 0, err.decode()
    assert results[0][1].decode().split() == ["ok", str(BATCHES), "torch=shared"]
    assert results[1][1].decode().split() == ["ok", str(BATCHES), "torch=shared"]
    assert results[2][1].decode().split()[:2] == ["ok", str(BATCHES)]
    assert results[3][1].decode().split() == ["ok", str(BATCHES)]
