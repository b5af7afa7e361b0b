"""Train with torchrun, fed by one ringfeed loader per machine.

    # the loader and the job as one command (on several machines, each runs it):
    ringfeed run --source /data/tokens --batch-size 8 --record-bytes 4096 --epochs 3 \
        -- torchrun --nproc-per-node 8 examples/train_ddp.py

`ringfeed run` starts the loader with the world size and machine rank taken
from torchrun's flags and gives the ranks its name ($RINGFEED_NAME);
check_same_plan() checks that every machine's loader serves the same files in
the same order.

Each rank attaches to its slice of the ring (rank from LOCAL_RANK), and
ringfeed.torch.Loader gives each batch as a (B, L) tensor of tokens: each
sample's bytes read as uint16 tokens (an odd last byte left out), cut to
SEQ_LEN (2048) or padded with 0 to the batch's longest sample, so any
directory of files of any sizes trains as it is (for fixed-size records, pass
--record-bytes: every sample then has the same length). On a GPU the batch is
copied with non_blocking=True. Every rank gets the same number of batches per
epoch, so DDP never hangs on a short rank. The toy model's vocabulary is
small; SMALL=1 makes it smaller still (and SEQ_LEN 64), for a test on the CPU
that takes seconds.

Checkpoints: with CHECKPOINT=PATH, rank 0 saves the model, the optimizer and
the loader's state_dict() there every 20 steps, and a later run goes on from
it with load_state_dict(): run the same `ringfeed run` command again. Its
loader (`--resume auto`) starts where every rank's checkpoint says;
load_state_dict() stops every rank, naming the fix, if the checkpoint was
saved under another sample order (dataset, --seed, --no-shuffle).

For tests: SAMPLES_LOG=DIR has each rank append the sample indices of every
batch it trains on to DIR/rank-R.log ("epoch step i i i ..."), and
STOP_AFTER_STEP=K has every rank, after the first step K and its checkpoint,
say "stopped after step K" and wait to be killed, as a job is mid-run.
"""
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

import ringfeed
import ringfeed.torch

SMALL = bool(os.environ.get("SMALL"))
VOCAB = 256 if SMALL else 4096
WIDTH = 32 if SMALL else 64
SEQ_LEN = int(os.environ.get("SEQ_LEN", 64 if SMALL else 2048))


def tokens_of(samples):
    """The collate for samples of any sizes: each sample's bytes as uint16
    tokens (an odd last byte left out), cut to SEQ_LEN and padded with 0 to
    the batch's longest, as one (B, L) int64 tensor (a copy: the slot goes
    back at once)."""
    lengths = [min(len(s) // 2, SEQ_LEN) for s in samples]
    out = np.zeros((len(samples), max(max(lengths, default=0), 2)), dtype=np.int64)
    for row, (sample, n) in enumerate(zip(samples, lengths)):
        out[row, :n] = sample[: 2 * n].view(np.uint16)
    return torch.from_numpy(out)


def every_epoch(loader):
    """Every batch of the run: a `for` over a Loader is one epoch (len(loader)
    steps), as over a DataLoader; loader.epochs() yields each epoch the
    loader (`--epochs`) still serves."""
    for _epoch in loader.epochs():
        yield from loader


def main():
    distributed = "RANK" in os.environ
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        # Before any collective: NCCL's object collectives (check_same_plan)
        # use the current device, cuda:0 on every rank otherwise.
        torch.cuda.set_device(device)
    if distributed:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, WIDTH), torch.nn.Linear(WIDTH, VOCAB)).to(device)
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    checkpoint = os.environ.get("CHECKPOINT")
    saved = torch.load(checkpoint, map_location=device) if checkpoint and os.path.exists(checkpoint) else None
    if saved:
        (model.module if distributed else model).load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])

    feed = ringfeed.attach()  # RINGFEED_NAME, LOCAL_RANK
    if distributed:
        # Every rank's loader serves the same plan (same files, seed, batch
        # size, ...): on several machines, each has its own loader. After
        # torchrun restarted every rank (--max-restarts), it also brings the
        # ranks to the same step.
        ringfeed.check_same_plan(feed)
    # For tests of torchrun --max-restarts: rank 1's first attempt dies there.
    crash_at_step = int(os.environ.get("CRASH_AT_STEP", -1))
    samples_log = os.environ.get("SAMPLES_LOG")
    if samples_log:
        samples_log = open(os.path.join(samples_log, "rank-%s.log" % os.environ.get("RANK", 0)), "a")
    stop_after_step = int(os.environ.get("STOP_AFTER_STEP", -1))
    # Each batch as a (B, L) tensor of tokens, on `device`, whatever the
    # samples' sizes.
    loader = ringfeed.torch.Loader(feed, collate=tokens_of, device=device)
    if saved:
        # The loader goes on where the checkpoint does, under the same sample
        # order: else some samples would be trained twice and others never.
        loader.load_state_dict(saved["data"])
    for tokens in every_epoch(loader):
        x = tokens % VOCAB  # int64 (B, L) from tokens_of: a copy, the slot went back
        del tokens
        logits = model(x[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), x[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if samples_log:
            samples_log.write("%d %d %s\n" % (loader.epoch, loader.step, " ".join(str(int(i)) for i in loader.indices)))
            samples_log.flush()
        stopping = loader.step == stop_after_step
        if loader.step == crash_at_step and int(os.environ.get("RANK", 0)) == 1 and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
            print("rank 1 crashing on purpose at step %d (CRASH_AT_STEP)" % loader.step, flush=True)
            os._exit(3)
        if (loader.step % 20 == 0 or stopping) and int(os.environ.get("RANK", 0)) == 0:
            # Every rank has trained on this step (DDP's all-reduce), so a run
            # from this checkpoint goes on after it.
            epoch, samples = loader.resume_state
            print("epoch %d step %d loss %.3f (resume: --resume %d:%d)" % (loader.epoch, loader.step, loss.item(), epoch, samples),
                  flush=True)
            if checkpoint:
                state = {
                    "model": (model.module if distributed else model).state_dict(),
                    "opt": opt.state_dict(),
                    "data": loader.state_dict(),
                }
                torch.save(state, checkpoint + ".tmp")
                os.replace(checkpoint + ".tmp", checkpoint)
                print("checkpoint %s: restart the loader with --resume %d:%d, or under `ringfeed run` run the same "
                      "command again" % (checkpoint, epoch, samples), flush=True)
        if stopping:
            if distributed:
                dist.barrier()  # rank 0's checkpoint is on disk
            print("rank %s stopped after step %d" % (os.environ.get("RANK", 0), loader.step), flush=True)
            while True:
                time.sleep(1)
    loader.close()
    feed.close()
    if distributed:
        # Every rank out of its last collective before any tears gloo down: a
        # rank that destroyed its group while its peer was still finishing
        # made the peer abort ("terminate called without an active
        # exception", seen once in CI with two machines).
        dist.barrier()
        dist.destroy_process_group()
        # Nothing is left to do, so leave without the interpreter's
        # finalization: there, gloo's worker threads can still hold work
        # objects whose release aborts the process ("terminate called
        # without an active exception", SIGABRT; pytorch/pytorch#179291
        # describes it), which CI saw once in about three runs even with the
        # barrier above, and torchrun then reports a job that trained to
        # the end as failed.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
