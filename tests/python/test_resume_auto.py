"""serve --resume auto: the trainers say where the run starts (a checkpoint's
load_state_dict, or nothing for a fresh run), and the loader serves from
there exactly as a loader started with that --resume would. Ranks that
disagree, or a checkpoint of another order, are refused with the fix named."""

import subprocess
import uuid

import pytest

import ringfeed
from e2e_util import kill_survivors, ringfeed_bin

FILES = 100


@pytest.fixture
def dataset(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    for i in range(FILES):
        (root / ("f%03d" % i)).write_bytes(b"%03d" % i * 10)
    return root


def serve(root, world_size, *flags):
    name = "auto-" + uuid.uuid4().hex[:8]
    proc = subprocess.Popen(
        [ringfeed_bin(), "serve", "--source", str(root), "--name", name, "--batch-size", "4",
         "--world-size", str(world_size), "--epochs", "3", "--seed", "7", *flags],
        stderr=subprocess.PIPE,
    )
    return name, proc


def drain(feeds):
    """Every batch of every rank: [(epoch, step, rank, indices, resume_state)].
    One thread a rank, as ranks are processes in a job: a rank's first batch
    waits for every rank to say where the run starts."""
    import threading

    got, errors = [], []

    def take(rank, feed):
        try:
            for batch in feed:
                got.append((batch.epoch, batch.step, rank, tuple(int(i) for i in batch.indices), batch.resume_state))
                batch.release()
        except Exception as e:  # reported by the test
            errors.append(e)

    threads = [threading.Thread(target=take, args=(r, f)) for r, f in enumerate(feeds)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return got


def run_loader(root, world_size, flags, request=None, order=None):
    name, proc = serve(root, world_size, *flags)
    try:
        feeds = [ringfeed.attach(name, r, timeout=30) for r in range(world_size)]
        if request is not None:
            for feed in feeds:
                feed.request_start(request[0], request[1], order if order is not None else feed.order)
        got = drain(feeds)
        for feed in feeds:
            feed.close()
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err.decode()
        return got
    finally:
        kill_survivors([proc])


def indices(got):
    return [i for (_, _, _, idx, _) in sorted(got, key=lambda g: (g[0], g[1], g[2])) for i in idx]


def states(got):
    return [g[4] for g in sorted(got, key=lambda g: (g[0], g[1], g[2]))]


@pytest.mark.parametrize("world_size", [1, 2])
def test_ranks_that_ask_for_a_checkpoints_state_get_what_serve_resume_would_give(dataset, world_size):
    fixed = run_loader(dataset, world_size, ["--resume", "1:40"])
    auto = run_loader(dataset, world_size, ["--resume", "auto"], request=(1, 40))
    assert indices(auto) == indices(fixed)
    assert states(auto) == states(fixed), "resume states after each batch agree"
    assert min(g[0] for g in auto) == 1


def test_a_fresh_run_under_auto_is_a_run_from_the_start(dataset):
    assert indices(run_loader(dataset, 2, ["--resume", "auto"])) == indices(run_loader(dataset, 2, []))


def test_a_checkpoint_of_a_run_with_another_world_size_goes_on_exactly(dataset):
    whole = indices(run_loader(dataset, 1, []))
    # The first run, with 2 ranks, stops after 5 steps of epoch 0: its state.
    first = run_loader(dataset, 2, [])
    state = [g[4] for g in first if g[0] == 0 and g[1] == 4 and g[2] == 0][0]
    done = indices([g for g in first if (g[0], g[1]) <= (0, 4)])
    rest = indices(run_loader(dataset, 1, ["--resume", "auto"], request=state))
    assert done + rest == whole[: len(done) + len(rest)]
    assert len(done) + len(rest) >= len(whole) - 8


def test_ranks_that_ask_for_different_starts_stop_the_loader_and_every_rank_hears_why(dataset):
    name, proc = serve(dataset, 2, "--resume", "auto")
    try:
        a = ringfeed.attach(name, 0, timeout=30)
        b = ringfeed.attach(name, 1, timeout=30)
        a.request_start(1, 40, a.order)
        for feed in (b, a):  # b's first next() says: a fresh start
            with pytest.raises(ringfeed.AbortedError, match="rank 0 1:40, rank 1 a fresh start"):
                feed.next(timeout=30)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode != 0 and "every rank must load the same checkpoint" in err.decode()
    finally:
        kill_survivors([proc])


def test_a_checkpoint_of_another_order_is_refused_before_the_loader_moves(dataset):
    name, proc = serve(dataset, 1, "--resume", "auto")
    try:
        feed = ringfeed.attach(name, 0, timeout=30)
        n, seed, shuffled = feed.order
        with pytest.raises(ringfeed.ResumeMismatchError, match="--seed"):
            feed.request_start(1, 40, (n, seed + 1, shuffled))
        with pytest.raises(ringfeed.ResumeMismatchError, match="130"):
            feed.request_start(1, 40, (130, seed, shuffled))
        feed.request_start(1, 40, feed.order)
        assert feed.next(timeout=30).epoch == 1
        feed.close()
    finally:
        kill_survivors([proc])


def test_a_loader_with_a_fixed_start_is_checked_instead_and_a_mismatch_names_resume(dataset):
    name, proc = serve(dataset, 1)
    try:
        feed = ringfeed.attach(name, 0, timeout=30)
        with pytest.raises(ringfeed.ResumeMismatchError, match="--resume 1:40"):
            feed.request_start(1, 40, feed.order)
        feed.close()
    finally:
        kill_survivors([proc])
