"""Train with torchrun, fed by one ringfeed loader per machine.

    # once per machine, beside the job (it exits when every batch was released):
    ringfeed serve --source /data/tokens --name job1 --batch-size 8 \
        --record-bytes 4096 --world-size 8 --epochs 3 &
    # the job, unchanged apart from where batches come from:
    RINGFEED_NAME=job1 torchrun --nproc-per-node 8 examples/train_ddp.py

On several machines, each runs its own loader with the whole job's world size
and its place in it (`--world-size 16 --nnodes 2 --node-rank N`), and torchrun
as usual; attach() checks RANK and WORLD_SIZE against the loader's ranks, and
check_same_plan() that all the loaders serve the same files in the same order.

Each rank attaches to its slice of the ring (rank from LOCAL_RANK), and
ringfeed.torch.Loader gives each batch as a (B, L) uint16 tensor of tokens
(record bytes / 2 of them): on a GPU, copied from the pinned ring with
non_blocking=True, the slot going back once the copy is done; on the CPU, a
zero-copy view of the slot, which goes back once the tensor is dropped. Every
rank gets the same number of batches per epoch, so DDP never hangs on a short
rank. The toy model's vocabulary is small.

Checkpoints: with CHECKPOINT=PATH, rank 0 saves the model, the optimizer and
the loader's state_dict() there every 20 steps, and a later run goes on from
it with load_state_dict(). Restart the loader with the `--resume E:S` the
last "checkpoint" line printed; load_state_dict() stops every rank, naming
the flag, if the loader does not start there or serves another sample order.
"""
import os

import torch
import torch.distributed as dist

import ringfeed
import ringfeed.torch

VOCAB = 4096


def main():
    distributed = "RANK" in os.environ
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        # Before any collective: NCCL's object collectives (check_same_plan)
        # use the current device, cuda:0 on every rank otherwise.
        torch.cuda.set_device(device)
    if distributed:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 64), torch.nn.Linear(64, VOCAB)).to(device)
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
    # Each batch as a (B, L) uint16 tensor of tokens, on `device`.
    loader = ringfeed.torch.Loader(feed, dtype=torch.uint16, shape=(-1,), device=device)
    if saved:
        # The loader goes on where the checkpoint does, under the same sample
        # order: else some samples would be trained twice and others never.
        loader.load_state_dict(saved["data"])
    for tokens in loader:
        x = tokens.long() % VOCAB
        del tokens  # on the CPU a view of the slot: dropped, the slot goes back
        logits = model(x[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), x[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loader.step == crash_at_step and int(os.environ.get("RANK", 0)) == 1 and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
            print("rank 1 crashing on purpose at step %d (CRASH_AT_STEP)" % loader.step, flush=True)
            os._exit(3)
        if loader.step % 20 == 0 and int(os.environ.get("RANK", 0)) == 0:
            # Every rank has trained on this step (DDP's all-reduce), so
            # `ringfeed serve ... --resume E:N` with the loader's resume_state
            # goes on after it.
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
                print("checkpoint %s: restart the loader with --resume %d:%d" % (checkpoint, epoch, samples), flush=True)
    loader.close()
    feed.close()
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
