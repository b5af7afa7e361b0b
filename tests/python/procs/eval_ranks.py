"""An evaluation loop under torchrun for test_tail.py: each rank takes its
batches of every epoch through ringfeed.torch.Loader (one epoch per `for`)
and all_reduces its batch's sample count every step (gloo), as a metric's
sum would; a rank with fewer steps than its peers would leave them waiting
in the collective. Writes LOG_DIR/rank-R.log: "len N", then per batch
"batch EPOCH STEP i i ...", then per epoch "epoch-total EPOCH STEPS SAMPLES"
(the all-reduced sum)."""
import os
import sys

import torch
import torch.distributed as dist

import ringfeed
import ringfeed.torch


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    feed = ringfeed.attach()
    # Samples of different sizes: a count of each batch's samples, and its
    # indices, are all this loop needs.
    loader = ringfeed.torch.Loader(feed, collate=lambda samples: torch.tensor([len(samples)]))
    with open(os.path.join(sys.argv[1], "rank-%d.log" % rank), "w") as log:
        log.write("len %d\n" % len(loader))
        for epoch in loader.epochs():
            steps, total = 0, 0
            for count in loader:
                log.write("batch %d %d %s\n" % (loader.epoch, loader.step, " ".join(str(int(i)) for i in loader.indices)))
                dist.all_reduce(count)
                steps, total = steps + 1, total + int(count)
            log.write("epoch-total %d %d %d\n" % (epoch, steps, total))
    loader.close()
    feed.close()
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # as examples/train_ddp.py: no gloo teardown in finalization


if __name__ == "__main__":
    main()
