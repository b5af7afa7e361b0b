"""Lengths and the DataLoader shape (issue 39, item 1): `len(feed)` and
`len(ringfeed.torch.Loader(...))` are this rank's steps of an epoch, the same
for every rank; `feed.info` has the per-epoch figures; a Loader is an
IterableDataset whose every `for` is one epoch, so it works in a plain loop,
in `torch.utils.data.DataLoader(loader, batch_size=None)` (the documented
line) and in Lightning's `Trainer.fit`, which sees the right number of steps
an epoch. With `--tail keep` the last batches are short tensors, an empty one
a (0, ...) tensor. Real loaders throughout."""
import subprocess
import threading
import uuid
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ringfeed  # noqa: E402
import ringfeed.torch  # noqa: E402
from e2e_util import kill_survivors, ringfeed_bin  # noqa: E402

# 50 records of 16 bytes: 3 ranks x 4 make 12 a step, 4 whole steps and a
# tail of 2 (dropped: 4 steps an epoch; kept: 5, rank 0 gets 2, ranks 1 and
# 2 an empty batch).
N, RECORD, B = 50, 16, 4


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    d = tmp_path_factory.mktemp("epoch-len")
    (d / "r.bin").write_bytes(b"".join(i.to_bytes(RECORD, "little") for i in range(N)))
    return d


@pytest.fixture
def serve(records):
    """serve(world, *flags) starts a loader over the records; its name."""
    loaders = []

    def start(world, *flags):
        name = "len-%s" % uuid.uuid4().hex[:8]
        loaders.append(subprocess.Popen(
            [ringfeed_bin(), "serve", "--source", str(records), "--name", name, "--record-bytes", str(RECORD),
             "--batch-size", str(B), "--world-size", str(world), "--seed", "3", "--manifest-cache", "off", *flags],
            stderr=subprocess.PIPE, text=True))
        return name

    yield start
    for loader in loaders:
        if loader.poll() is None:
            loader.terminate()
    kill_survivors(loaders)
    for loader in loaders:
        loader.communicate()


def _each_rank(world, fn):
    """fn(rank) on one thread a rank; their results by rank."""
    out, errors = {}, []

    def run(r):
        try:
            out[r] = fn(r)
        except BaseException as e:  # noqa: BLE001 - raised below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    return out


@pytest.mark.parametrize("tail, steps, samples", [("drop", 4, 48), ("keep", 5, 50)])
def test_len_of_a_feed_is_its_steps_of_an_epoch_the_same_for_every_rank(serve, tail, steps, samples):
    # The default drops the tail (no flag: a loader of today).
    name = serve(3, "--epochs", "2", *(["--tail", tail] if tail == "keep" else []))

    def rank(r):
        with ringfeed.attach(name, r, timeout=30) as feed:
            info = feed.info
            got = (len(feed), info.tail, info.steps_per_epoch, info.samples_per_epoch, info.batches_expected,
                   feed.steps_in_epoch(0), feed.steps_in_epoch(1))
            per_epoch = {}
            for batch in feed:
                per_epoch[batch.epoch] = per_epoch.get(batch.epoch, 0) + 1
                batch.release()
            return got, per_epoch

    for r, (got, per_epoch) in _each_rank(3, rank).items():
        assert got == (steps, tail, steps, samples, 2 * steps, steps, steps), r
        assert per_epoch == {0: steps, 1: steps}, r


def test_a_resumed_runs_first_epoch_has_fewer_steps_and_len_stays_a_whole_epochs(serve):
    # --resume 0:24 over 1 rank of 4: 26 records left of epoch 0, 7 steps
    # (the last of 2, kept); a whole epoch is 13.
    name = serve(1, "--epochs", "2", "--tail", "keep", "--resume", "0:24")
    with ringfeed.attach(name, 0, timeout=30) as feed:
        assert len(feed) == 13 and feed.steps_in_epoch(0) == 7 and feed.steps_in_epoch(1) == 13
        assert feed.info.batches_expected == 20
        loader = ringfeed.torch.Loader(feed, dtype=torch.int64, shape=(2,))
        assert len(loader) == 13
        epochs, states = [], []
        for epoch in loader.epochs():
            # At an epoch's start (its first batch taken to see its epoch,
            # not yet the loop's): where the loop stands.
            states.append(loader.state_dict()["resume_state"])
            epochs.append((epoch, [tuple(x.shape) for x in loader]))
        assert states == [[0, 24], [1, 0]]
        assert [(e, len(shapes)) for e, shapes in epochs] == [(0, 7), (1, 13)]
        assert epochs[0][1][-1] == (2, 2) and epochs[1][1][-1] == (2, 2), "the kept tail: a short last batch"
        loader.close()


def test_each_loop_over_a_loader_is_one_epoch_with_short_and_empty_tensors_at_its_end(serve):
    name = serve(3, "--epochs", "2", "--tail", "keep", "--shuffle", "none")

    def rank(r):
        with ringfeed.torch.Loader(ringfeed.attach(name, r, timeout=30), dtype=torch.int64, shape=(-1,)) as loader:
            assert isinstance(loader, torch.utils.data.IterableDataset) and len(loader) == 5
            epochs = []
            for epoch in loader.epochs():
                epochs.append([])
                for x in loader:
                    assert loader.epoch == epoch
                    np.testing.assert_array_equal(x[:, 0].numpy() if len(x) else [], loader.indices)
                    epochs[-1].append(tuple(x.shape))
                    del x
            assert [x for x in loader] == [], "the run is over: an empty loop"
            return epochs

    last = {0: (2, 2), 1: (0, 0), 2: (0, 0)}  # rank 0: records 48, 49; the others: empty
    for r, epochs in _each_rank(3, rank).items():
        assert epochs == [[(4, 2)] * 4 + [last[r]]] * 2, r


def test_the_documented_dataloader_line_takes_one_epoch_per_loop_with_its_length(serve):
    name = serve(1, "--epochs", "2", "--shuffle", "none")
    feed = ringfeed.attach(name, 0, timeout=30)
    # docs/training.md and bindings/python/README.md:
    dataloader = torch.utils.data.DataLoader(ringfeed.torch.Loader(feed, dtype=torch.int64, shape=(2,)), batch_size=None)
    assert len(dataloader) == 12
    seen = []
    for epoch in range(2):
        batches = [x[:, 0].tolist() for x in dataloader]
        assert len(batches) == 12, epoch
        seen.append(sorted(i for b in batches for i in b))
    assert seen == [list(range(48))] * 2, "--shuffle none: the first 48 records, each epoch"
    assert [x for x in dataloader] == []
    feed.close()
    # A Feed is not a Dataset: the DataLoader's first fetch says what to wrap.
    with ringfeed.attach(serve(1, "--epochs", "1"), 0, timeout=30) as feed:
        with pytest.raises(TypeError, match=r"DataLoader\(ringfeed.torch.Loader\(feed\), batch_size=None\)"):
            next(iter(torch.utils.data.DataLoader(feed, batch_size=None)))
    # In a worker process the loader cannot read: refused, naming the fix.
    with ringfeed.torch.Loader(ringfeed.attach(serve(1, "--epochs", "1"), 0, timeout=30)) as loader:
        with pytest.raises(Exception, match="num_workers=0"):
            next(iter(torch.utils.data.DataLoader(loader, batch_size=None, num_workers=1,
                                                  multiprocessing_context="fork")))


def test_lightning_fits_with_the_loaders_steps_per_epoch(serve, tmp_path):
    lightning = pytest.importorskip("lightning")

    class Model(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)
            self.seen = []

        def training_step(self, x, batch_idx):
            self.seen.append((self.current_epoch, batch_idx, loader.epoch, loader.step, tuple(x.shape)))
            return self.layer(x.float()).square().mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    name = serve(1, "--epochs", "2", "--tail", "keep")
    loader = ringfeed.torch.Loader(ringfeed.attach(name, 0, timeout=30), dtype=torch.int64, shape=(2,))
    model = Model()
    trainer = lightning.Trainer(accelerator="cpu", max_epochs=2, logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False,
                                default_root_dir=str(tmp_path))
    trainer.fit(model, train_dataloaders=loader)
    assert trainer.num_training_batches == 13
    # Lightning's epochs are the loader's, step for step; the last batch short.
    assert [(e, i) for e, i, *_ in model.seen] == [(e, i) for e in range(2) for i in range(13)]
    assert all(e == le and i == ls for e, i, le, ls, _ in model.seen)
    assert [s for *_, s in model.seen if s != (4, 2)] == [(2, 2), (2, 2)]
    loader.close()


def test_an_empty_batch_of_decoded_images_is_a_zero_length_tensor(tmp_path):
    PIL = pytest.importorskip("PIL.Image")
    import io

    root = tmp_path / "img" / "only"
    root.mkdir(parents=True)
    for i in range(4):
        out = io.BytesIO()
        PIL.fromarray(np.full((20, 20, 3), i * 40, np.uint8)).save(out, "PNG")
        (root / ("%d.png" % i)).write_bytes(out.getvalue())
    name = "len-img-%s" % uuid.uuid4().hex[:8]
    loader = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", str(tmp_path / "img"), "--name", name, "--batch-size", "4",
         "--world-size", "2", "--tail", "keep", "--manifest-cache", "off", "--decode", "image", "--crop",
         "center:8"], stderr=subprocess.PIPE, text=True)
    try:
        def rank(r):
            with ringfeed.torch.Loader(ringfeed.attach(name, r, timeout=30)) as images:
                return [(tuple(x.shape), y.tolist(), zlib.crc32(x.numpy().tobytes())) for x, y in images]

        got = _each_rank(2, rank)
        _, err = loader.communicate(timeout=60)
        assert loader.returncode == 0, err
    finally:
        kill_survivors([loader])
    # 4 images, 2 ranks x 4: rank 0 gets them all, rank 1 an empty batch;
    # one step each.
    assert [s for s, _, _ in got[0]] == [(4, 3, 8, 8)] and [s for s, _, _ in got[1]] == [(0, 3, 8, 8)]
    assert got[0][0][1] == [0, 0, 0, 0] and got[1][0][1] == []
