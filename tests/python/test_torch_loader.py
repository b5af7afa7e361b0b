"""ringfeed.torch.Loader on the CPU, against real loaders: the tensors are
the bytes served, viewed in place; a dtype or shape that does not fit says
what would; collate gets zero-copy views; slots go back when the tensors
die; and state_dict / load_state_dict resume mid-epoch with exactly the rest
of the order. (The CUDA path is checked by gpu_check.py, on a GPU.)"""

import json
import subprocess
import uuid

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ringfeed  # noqa: E402
import ringfeed.torch  # noqa: E402
from conftest import expected_sample  # noqa: E402
from e2e_util import kill_survivors, ringfeed_bin  # noqa: E402


def _in_ring(feed, address):
    info = feed.info
    return info.payload_region_address <= address < info.payload_region_address + info.payload_region_bytes


def _expected_batch(p, step):
    return np.stack([expected_sample(i, p.sample_bytes) for i in p.expected_indices(step, 0)])


def test_tensors_are_the_bytes_served_viewed_in_the_ring_with_epoch_and_step(producer):
    p = producer(world_size=1, batches=5, batch_size=4, sample_bytes=64, slots_per_rank=2)
    with ringfeed.torch.Loader(ringfeed.attach(p.name, 0, timeout=5)) as loader:
        assert (loader.epoch, loader.step) == (None, None)
        steps = []
        for x in loader:
            assert x.dtype == torch.uint8 and tuple(x.shape) == (4, 64)
            assert _in_ring(loader.feed, x.data_ptr()), "a copy, not a view of the slot"
            np.testing.assert_array_equal(x.numpy(), _expected_batch(p, loader.step))
            np.testing.assert_array_equal(loader.indices, p.expected_indices(loader.step, 0))
            steps.append((loader.epoch, loader.step))
        assert steps == [(0, s) for s in range(5)]
        with pytest.raises(StopIteration):
            next(loader)
        del x
    assert p.wait() == 0  # every slot went back


@pytest.mark.parametrize("dtype, shape, batch_shape, want", [
    (torch.int16, (32,), None, lambda raw: raw.view(np.int16).reshape(4, 32)),
    (np.float32, (4, 4), None, lambda raw: raw.view(np.float32).reshape(4, 4, 4)),
    ("uint16", (-1,), None, lambda raw: raw.view(np.uint16).reshape(4, 32)),
    (torch.int64, None, (2, 16), lambda raw: raw.view(np.int64).reshape(2, 16)),
    (torch.uint8, None, None, lambda raw: raw),
])
def test_a_declared_dtype_and_shape_view_the_same_bytes(producer, dtype, shape, batch_shape, want):
    p = producer(world_size=1, batches=2, batch_size=4, sample_bytes=64, slots_per_rank=2)
    with ringfeed.torch.Loader(ringfeed.attach(p.name, 0, timeout=5), dtype=dtype, shape=shape,
                               batch_shape=batch_shape) as loader:
        for x in loader:
            expected = want(_expected_batch(p, loader.step))
            assert tuple(x.shape) == expected.shape
            np.testing.assert_array_equal(x.numpy(), expected)
            assert _in_ring(loader.feed, x.data_ptr())
        del x
    assert p.wait() == 0


def test_a_torch_dtype_numpy_lacks_is_a_view_of_the_same_bytes(producer):
    p = producer(world_size=1, batches=1, batch_size=4, sample_bytes=64, slots_per_rank=2)
    with ringfeed.torch.Loader(ringfeed.attach(p.name, 0, timeout=5), dtype=torch.bfloat16, shape=(32,)) as loader:
        x = next(loader)
        assert x.dtype == torch.bfloat16 and tuple(x.shape) == (4, 32)
        raw = torch.from_numpy(_expected_batch(p, 0).view(np.int16)).view(torch.bfloat16)
        assert torch.equal(x.view(torch.int16), raw.view(torch.int16))
        assert _in_ring(loader.feed, x.data_ptr())
        del x
        assert next(loader, None) is None
    assert p.wait() == 0


def test_a_shape_that_does_not_fit_a_sample_is_refused_naming_one_that_does(producer):
    p = producer(world_size=1, batches=2, batch_size=4, sample_bytes=64, slots_per_rank=2)
    with ringfeed.torch.Loader(ringfeed.attach(p.name, 0, timeout=5), dtype=torch.float32, shape=(5,)) as loader:
        with pytest.raises(ValueError) as e:
            next(loader)
        message = str(e.value)
        assert "shape=(5,) does not fit batch epoch 0 step 0 (4 samples of 64 bytes)" in message, message
        assert "e.g. shape=(16,)" in message, message
        assert len(message) < 400, message
        # The batch that did not fit went back: a loader that fits takes the next one.
        fitting = ringfeed.torch.Loader(loader.feed, dtype=torch.float32, shape=(16,))
        assert loader.feed.held == 0
        assert [tuple(x.shape) for x in fitting] == [(4, 16)]
    assert p.wait() == 0


@pytest.mark.parametrize("kwargs, words", [
    ({"dtype": ">u2"}, "not in this machine's byte order"),
    ({"dtype": "no such dtype"}, "dtype must be a torch or numpy dtype"),
    ({"dtype": np.dtype("U4")}, "has no torch equivalent"),
    ({"shape": (2, -1, -1)}, "at most one -1"),
    ({"shape": "ab"}, "shape must be a tuple of ints"),
    ({"shape": (4,), "batch_shape": (4, 4)}, "either shape="),
    ({"dtype": torch.uint8, "collate": list}, "either collate= or dtype="),
    ({"collate": 3}, "collate must be a function"),
    ({"prefetch": 0}, "prefetch must be an int from 1"),
    ({"device": "mps"}, "copies to CUDA devices"),
])
def test_bad_arguments_are_refused_at_once_naming_what_is_wrong(producer, kwargs, words):
    p = producer(world_size=1, batches=1)
    with ringfeed.attach(p.name, 0, timeout=5) as feed:
        with pytest.raises(ringfeed.InvalidArgumentError) as e:
            ringfeed.torch.Loader(feed, **kwargs)
        assert words in str(e.value), str(e.value)
        for b in feed:
            b.release()


def test_collate_gets_a_zero_copy_view_of_each_sample(producer):
    p = producer(world_size=1, batches=3, batch_size=4, sample_bytes=48, slots_per_rank=2)
    seen = []

    def collate(samples):
        assert all(s.dtype == np.uint8 and s.shape == (48,) for s in samples)
        seen.append([_in_ring(loader.feed, s.__array_interface__["data"][0]) for s in samples])
        return {"x": torch.stack([torch.from_numpy(s) for s in samples]), "first": samples[0]}

    with ringfeed.torch.Loader(ringfeed.attach(p.name, 0, timeout=5), collate=collate) as loader:
        for out in loader:
            np.testing.assert_array_equal(out["x"].numpy(), _expected_batch(p, loader.step))
            np.testing.assert_array_equal(out["first"], expected_sample(p.expected_indices(loader.step, 0)[0], 48))
        del out
    assert seen == [[True] * 4] * 3
    assert p.wait() == 0


def test_a_slot_goes_back_when_its_tensor_is_dropped_and_k_kept_tensors_stop_the_ring(producer):
    p = producer(world_size=1, batches=6, batch_size=2, sample_bytes=32, slots_per_rank=2)
    feed = ringfeed.attach(p.name, 0, timeout=5)
    loader = ringfeed.torch.Loader(feed)
    first = next(loader)
    assert feed.held == 1  # the tensor is a view: it holds its slot
    view = first[1:]
    del first
    assert feed.held == 1  # ... and so does any view of it
    del view
    assert feed.held == 0
    kept = [next(loader), next(loader)]  # both slots of the rank
    with pytest.raises(ringfeed.AllSlotsHeldError):
        next(loader)
    kept = [t.clone() for t in kept]  # copies hold nothing
    assert feed.held == 0
    rest = [loader.step for _ in loader]
    assert rest == [3, 4, 5]
    loader.close()
    assert not feed.closed  # a feed passed in is the caller's to close
    feed.close()
    assert p.wait() == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the fallback without CUDA")
def test_a_cuda_device_without_cuda_gives_cpu_tensors(producer, caplog):
    p = producer(world_size=1, batches=2, batch_size=2, sample_bytes=32, slots_per_rank=2)
    with ringfeed.torch.Loader(ringfeed.attach(p.name, 0, timeout=5), device="cuda") as loader:
        assert loader.device is None and not loader.pinned
        assert [x.device.type for x in loader] == ["cpu", "cpu"]
    assert "CUDA is not available" in caplog.text
    assert p.wait() == 0


# Resume, against `ringfeed serve` over one file of N records of 16 bytes:
# record i holds i (u64) and i + 1. B=4, W=1: 25 steps an epoch.
N, B, RECORD_BYTES = 100, 4, 16


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    root = tmp_path_factory.mktemp("torch-loader")
    ids = np.arange(N, dtype=np.uint64)
    (root / "records.bin").write_bytes(np.stack([ids, ids + 1], axis=1).tobytes())
    return root


@pytest.fixture
def serve(records):
    """serve(*flags) starts a loader (2 epochs, --seed 5) and returns its name."""
    loaders = []

    def start(*flags):
        name = "torch-loader-%s" % uuid.uuid4().hex[:8]
        loaders.append(subprocess.Popen(
            [ringfeed_bin(), "serve", "--source", str(records), "--name", name, "--batch-size", str(B),
             "--record-bytes", str(RECORD_BYTES), "--world-size", "1", "--epochs", "2", "--seed", "5",
             "--manifest-cache", "off", *flags],
            stderr=subprocess.DEVNULL))
        return name

    yield start
    for loader in loaders:
        if loader.poll() is None:
            loader.terminate()
    for loader in loaders:
        try:
            loader.wait(timeout=10)
        finally:
            kill_survivors([loader])


def _take(loader, steps=None):
    """(epoch, indices) of the next ``steps`` batches (all: None), over every
    epoch (a `for` over a Loader is one), checking that each tensor holds the
    records its indices name."""
    out = []
    for _epoch in loader.epochs():
        for x in loader:
            ids = x[:, 0].numpy()
            np.testing.assert_array_equal(ids, loader.indices)
            np.testing.assert_array_equal(x[:, 1].numpy(), ids + 1)
            out.append((loader.epoch, [int(i) for i in ids]))
            del x
            if steps is not None and len(out) == steps:
                return out
    return out


def test_a_resume_mid_epoch_from_state_dict_gets_exactly_the_rest_of_the_order(serve):
    with ringfeed.torch.Loader(ringfeed.attach(serve(), 0, timeout=30), dtype=torch.int64, shape=(2,)) as loader:
        whole = _take(loader)
    assert len(whole) == 2 * (N // B)

    feed = ringfeed.attach(serve(), 0, timeout=30)
    loader = ringfeed.torch.Loader(feed, dtype=torch.int64, shape=(2,))
    assert loader.state_dict()["resume_state"] == [0, 0]
    first = _take(loader, 7)
    state = json.loads(json.dumps(loader.state_dict()))  # as a checkpoint gives it back
    assert state == {"version": ringfeed.torch.STATE_VERSION, "resume_state": [0, 28], "order": [N, 5, True],
                     "epoch": 0, "step": 6}
    loader.close()
    feed.close()

    feed = ringfeed.attach(serve("--resume", "0:28"), 0, timeout=30)
    loader = ringfeed.torch.Loader(feed, dtype=torch.int64, shape=(2,))
    loader.load_state_dict(state)
    assert loader.state_dict()["resume_state"] == [0, 28]
    rest = _take(loader)
    loader.close()
    feed.close()
    assert first + rest == whole


def test_load_state_dict_refuses_a_loader_that_would_go_elsewhere_naming_the_fix(serve):
    state = {"version": 1, "resume_state": [1, 40], "order": [N, 5, True], "epoch": 1, "step": 9}
    with ringfeed.torch.Loader(ringfeed.attach(serve(), 0, timeout=30)) as loader:
        with pytest.raises(ringfeed.ResumeMismatchError) as e:
            loader.load_state_dict(state)
        assert "--resume 1:40" in str(e.value), str(e.value)
        with pytest.raises(ringfeed.ResumeMismatchError) as e:
            loader.load_state_dict(dict(state, order=[N, 6, True]))
        assert "--seed 5, the checkpoint's run with --seed 6" in str(e.value), str(e.value)


class _AskingFeed:
    """A real feed, plus the request_start a newer binding has: records the calls."""

    def __init__(self, feed):
        self._feed, self.asked = feed, []

    def __getattr__(self, attr):
        return getattr(self._feed, attr)

    def request_start(self, epoch, samples, order):
        self.asked.append((epoch, samples, order))


def test_load_state_dict_asks_a_feed_that_can_be_asked_to_start_there(serve):
    # A loader with no --resume: check_resume would refuse this state.
    feed = _AskingFeed(ringfeed.attach(serve(), 0, timeout=30))
    with ringfeed.torch.Loader(feed) as loader:
        loader.load_state_dict({"version": 1, "resume_state": [1, 40], "order": [N, 5, True], "epoch": 1, "step": 9})
        assert feed.asked == [(1, 40, (N, 5, True))]
        assert loader.state_dict()["resume_state"] == [1, 40]
    feed.close()


@pytest.mark.parametrize("state, words", [
    ([0, 28], "state must be a dict"),
    ({"resume_state": [0, 28], "order": None}, "no valid 'version'"),
    ({"version": 2, "resume_state": [0, 28], "order": None}, "state version 2 is newer than this ringfeed reads (1)"),
    ({"version": 1, "order": None}, "state has no 'resume_state'"),
    ({"version": 1, "resume_state": [0, -1], "order": None}, "state['resume_state'] must be (epoch, samples)"),
    ({"version": 1, "resume_state": None, "order": None}, "holds no resume state"),
    ({"version": 1, "resume_state": [0, 28], "order": [N, 5]}, "state['order'] must be"),
])
def test_a_state_that_is_not_a_state_dict_is_refused_naming_what_is_wrong(serve, state, words):
    with ringfeed.torch.Loader(ringfeed.attach(serve(), 0, timeout=30)) as loader:
        with pytest.raises(ringfeed.InvalidArgumentError) as e:
            loader.load_state_dict(state)
        assert words in str(e.value), str(e.value)


def test_load_state_dict_after_the_first_batch_is_refused(serve):
    with ringfeed.torch.Loader(ringfeed.attach(serve(), 0, timeout=30)) as loader:
        state = loader.state_dict()
        next(loader)
        with pytest.raises(ringfeed.InvalidArgumentError, match="before iterating"):
            loader.load_state_dict(state)


def test_a_loader_with_no_feed_attaches_from_the_environment_and_closes_what_it_attached(producer, monkeypatch):
    p = producer(world_size=1, batches=2, batch_size=2, sample_bytes=32, slots_per_rank=2)
    monkeypatch.setenv("RINGFEED_NAME", p.name)
    for var in ("LOCAL_RANK", "RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    with ringfeed.torch.Loader() as loader:
        assert (loader.feed.name, loader.feed.rank) == (p.name, 0)
        assert [loader.step for _ in loader] == [0, 1]
    assert loader.feed.closed
    with pytest.raises(ValueError, match="closed"):
        next(ringfeed.torch.Loader(loader.feed))
    assert p.wait() == 0
