"""ringfeed.check_resume against real loaders: a checkpoint's resume state
and sample order must match the loader it goes on with, or the trainer
stops with the `serve` flag to fix, instead of training some samples twice
and others never with no error anywhere."""

import logging
import subprocess
import uuid

import pytest

import ringfeed
from ringfeed import _resume
from e2e_util import kill_survivors, ringfeed_bin

# 100 samples, B=8, W=1: 12 steps an epoch, 4 samples of tail.
N, B = 100, 8


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume-check")
    for i in range(N):
        (root / ("f%03d" % i)).write_bytes(b"%d" % i)
    return root


@pytest.fixture
def serve(dataset):
    """serve(*flags) starts a loader (3 epochs, --seed 7, unless flags say
    otherwise) and returns an attached feed; loaders are stopped after the test."""
    loaders = []

    def start(*flags, source=None):
        name = "resume-check-%s" % uuid.uuid4().hex[:8]
        defaults = {"--epochs": "3", "--seed": "7"}
        extra = [a for k, v in defaults.items() if k not in flags for a in (k, v)]
        loader = subprocess.Popen(
            [ringfeed_bin(), "serve", "--source", str(source or dataset), "--name", name, "--batch-size", str(B),
             "--world-size", "1", "--manifest-cache", "off", *extra, *flags],
            stderr=subprocess.DEVNULL)
        loaders.append(loader)
        return ringfeed.attach(name, rank=0, timeout=30)

    yield start
    for loader in loaders:
        if loader.poll() is None:
            loader.terminate()
    for loader in loaders:
        try:
            loader.wait(timeout=10)
        finally:
            kill_survivors([loader])


def test_a_fresh_run_and_its_loader_agree(serve):
    feed = serve()
    assert feed.order == (N, 7, True)
    ringfeed.check_resume(feed, None)
    ringfeed.check_resume(feed, (0, 0), (N, 7, True))
    # A list, as a checkpoint saved as JSON gives it back.
    ringfeed.check_resume(feed, [0, 0], [N, 7, 1])


def test_a_loader_started_without_the_checkpoints_resume_is_named_with_the_flag_to_add(serve):
    feed = serve()
    with pytest.raises(ringfeed.ResumeMismatchError) as e:
        ringfeed.check_resume(feed, (1, 40), feed.order)
    assert "was started with no --resume" in str(e.value)
    assert "--resume 1:40" in str(e.value)


def test_a_loader_resumed_for_a_run_that_starts_afresh_is_refused(serve):
    feed = serve("--resume", "1:40")
    ringfeed.check_resume(feed, (1, 40))
    with pytest.raises(ringfeed.ResumeMismatchError) as e:
        ringfeed.check_resume(feed, None)
    assert "with --resume 1:40" in str(e.value) and "starts afresh" in str(e.value)
    with pytest.raises(ringfeed.ResumeMismatchError) as e:
        ringfeed.check_resume(feed, (1, 48))
    assert "--resume 1:48" in str(e.value)


def test_a_state_with_less_than_a_step_left_is_the_start_of_the_next_epoch(serve):
    # 100 - 96 = 4 samples left, fewer than a step of 8: the loader goes on with epoch 2.
    feed = serve("--resume", "1:96")
    ringfeed.check_resume(feed, (2, 0))
    feed.close()
    feed = serve("--resume", "2:0")
    ringfeed.check_resume(feed, (1, 96))


@pytest.mark.parametrize("flags, saved, words", [
    ((), (N + 30, 7, True), ["it serves 100 samples, the checkpoint's run 130", "files added or removed"]),
    ((), (N, 8, True), ["--seed 7, the checkpoint's run with --seed 8"]),
    (("--no-shuffle",), (N, 7, True), ["it runs with --no-shuffle, the checkpoint's run with a shuffle"]),
    (("--shuffle", "block"), (N, 7, True),
     ["it runs --shuffle block --shuffle-block 64 --shuffle-window 4, the checkpoint's run the exact shuffle"]),
    (("--shuffle", "block", "--shuffle-block", "4", "--shuffle-window", "3"), (N, 7, True, 4, 2),
     ["--shuffle-block 4 --shuffle-window 3, the checkpoint's run --shuffle block --shuffle-block 4 --shuffle-window 2"]),
    ((), (N, 7, True, 256, 8), ["it runs the exact shuffle, the checkpoint's run --shuffle block"]),
])
def test_a_checkpoint_of_another_sample_order_is_refused_naming_what_differs(serve, flags, saved, words):
    feed = serve(*flags)
    with pytest.raises(ringfeed.ResumeMismatchError) as e:
        ringfeed.check_resume(feed, (0, 0), saved)
    for w in words:
        assert w in str(e.value), str(e.value)
    assert "another sample order" in str(e.value)


def test_a_block_order_is_recorded_with_its_shape_and_resumes_under_the_same_one(serve):
    feed = serve("--shuffle", "block", "--shuffle-block", "4", "--shuffle-window", "3")
    assert feed.order == (N, 7, True, 4, 3)
    assert feed.info.shuffle_block == (4, 3)
    ringfeed.check_resume(feed, (0, 0), feed.order)
    # As a checkpoint saved as JSON gives it back.
    ringfeed.check_resume(feed, [0, 0], [N, 7, 1, 4, 3])


def test_the_seed_of_an_unshuffled_order_is_not_compared(serve):
    feed = serve("--no-shuffle", "--seed", "1")
    assert feed.order == (N, 1, False)
    ringfeed.check_resume(feed, (0, 0), (N, 99, False))


def test_bad_arguments_are_refused_naming_the_shape(serve):
    feed = serve()
    for state in ["0:0", (0,), (0, -1), (0.5, 0)]:
        with pytest.raises(ringfeed.InvalidArgumentError, match="state must be"):
            ringfeed.check_resume(feed, state)
    with pytest.raises(ringfeed.InvalidArgumentError, match="order must be"):
        ringfeed.check_resume(feed, (0, 0), (N, 7))
    with pytest.raises(ringfeed.InvalidArgumentError, match="order must be"):
        ringfeed.check_resume(feed, (0, 0), (N, 7, True, 4))


def test_trainers_restarted_while_the_loader_runs_on_go_on_after_what_was_taken(serve, caplog):
    # A loader started inside epoch 0; the first trainer takes 15 batches
    # (into epoch 1) and dies; its replacement finds the loader 15 steps on.
    feed = serve("--resume", "0:16")
    states = []
    for _ in range(15):
        batch = feed.next()
        states.append(batch.resume_state)
        batch.release()
    # The helper's arithmetic is the batches' own, across the epoch boundary.
    start, per_step = (0, 16), B
    assert [_resume.advance(start, k, N, per_step) for k in range(1, 16)] == states
    name = feed.name
    feed.close()
    feed = ringfeed.attach(name, rank=0, timeout=30)
    assert feed.taken == 15
    ringfeed.check_resume(feed, states[-1])  # checkpointed after the last batch: nothing lost
    with caplog.at_level(logging.WARNING, logger="ringfeed"):
        ringfeed.check_resume(feed, states[9])  # 5 steps after that checkpoint were taken
    assert "5 step(s) after the checkpoint's epoch %d, %d samples" % states[9] in caplog.text
    assert "are not trained again" in caplog.text
    # A checkpoint after the loader's position, or before its start, is refused.
    for state in [(2, 0), (0, 8)]:
        with pytest.raises(ringfeed.ResumeMismatchError) as e:
            ringfeed.check_resume(feed, state)
        assert "after the 15 batch(es) this rank took" in str(e.value)
    batch = feed.next()
    assert batch.resume_state == _resume.advance(start, 16, N, per_step)
    batch.release()
