"""Train an image classifier with torchrun, the loader decoding the images,
and validate it every epoch on a second loader.

    ringfeed serve --source /data/imagenet/val --name val --batch-size 64 --epochs 90 \
        --world-size 8 --decode image --crop center:224 --tail keep &
    VAL_LOADER=val ringfeed run --source /data/imagenet/train --batch-size 64 --epochs 90 \
        --decode image --crop random-resized:224 --flip \
        -- torchrun --nproc-per-node 8 examples/train_images.py

The loader decodes every JPEG, PNG or WebP, takes torchvision's
RandomResizedCrop(224) and a horizontal flip drawn from (seed, epoch, sample)
alone, and writes a (3, 224, 224) uint8 image per sample straight into the
ring, with each batch's labels (the class directory, as ImageFolder numbers
them). Each rank gets (images, labels) from ringfeed.torch.Loader with no
argument: on the GPU, copied once from the pinned ring. Normalisation is two
lines on the device. The trainer decodes nothing.

Validation (VAL_LOADER=NAME, a loader serving the val split): after each
training epoch every rank takes one epoch of the validation loader, whose
`--tail keep` serves every validation image exactly once across the ranks,
every rank the same number of steps (the last batches short or empty), and
`--crop center:224` torchvision's Resize(256) + CenterCrop(224). The counts
of right answers are summed over the ranks (one all_reduce) and rank 0
prints the top-1 accuracy. The model runs as its own module there, not
through DDP, so no collective depends on how many images a rank got.

The model is a ResNet-18 (written out here, so that torchvision is not
needed); SMALL=1 shrinks its width for a test on the CPU. STEPS=N stops after
N steps of each epoch.
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import ringfeed
import ringfeed.torch

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.down is None else self.down(x)))


def resnet18(classes, width=64):
    """torchvision's resnet18 layout: a 7x7 stem, four stages of two blocks."""
    layers = [nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = width
    for i, cout in enumerate([width, 2 * width, 4 * width, 8 * width]):
        layers += [Block(cin, cout, 1 if i == 0 else 2), Block(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def open_validation(device):
    """The validation loader named by VAL_LOADER (its images and labels),
    how many batches one of its epochs gives this rank (ceil(n / (W × B))
    under --tail keep), and its images; None without it."""
    name = os.environ.get("VAL_LOADER")
    if not name:
        return None
    feed = ringfeed.attach(name)  # rank from LOCAL_RANK, as the training feed
    loader = ringfeed.torch.Loader(feed, device=device)
    return loader, len(loader), feed.info.dataset_samples


@torch.no_grad()
def validate(model, val, mean, std, distributed):
    """One epoch of the validation loader: (right answers, images) over
    every rank."""
    loader, _, _ = val
    net = model.module if distributed else model  # no DDP collective per batch
    net.eval()
    counts = torch.zeros(2, dtype=torch.float64, device=mean.device)
    for x, y in loader:  # one epoch: len(loader) steps, the same on every rank
        if len(y):  # the last steps' batches may be short, or empty
            pred = net(x.float().sub_(mean).div_(std)).argmax(1)
            counts[0] += (pred == y).sum()
            counts[1] += len(y)
        del x, y  # on the CPU a view of the slot: dropped, the slot goes back
    net.train()
    if distributed:
        dist.all_reduce(counts)  # every rank took the same number of steps
    return counts


def say_top1(val, counts, epoch):
    right, seen = counts.tolist()
    if int(os.environ.get("RANK", 0)) == 0:
        print("epoch %d val top-1 %.1f%% of %d images (%d in the val split)" % (
            epoch, 100.0 * right / max(seen, 1), seen, val[2]), flush=True)


def main():
    distributed = "RANK" in os.environ
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if distributed:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    feed = ringfeed.attach()  # RINGFEED_NAME, LOCAL_RANK
    images = feed.info.images
    if images is None:
        raise SystemExit("the loader serves bytes, not images: start it with --decode image")
    names = feed.classes  # ImageFolder's order: label i names names[i]
    classes = max(images.classes, len(names), 1)
    if int(os.environ.get("RANK", 0)) == 0 and names:
        print("classes: %d (%s ... %s)" % (len(names), names[0], names[-1]), flush=True)
    model = resnet18(classes, width=8 if os.environ.get("SMALL") else 64).to(device)
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    mean, std = MEAN.to(device), STD.to(device)
    steps = int(os.environ.get("STEPS", -1))
    loader = ringfeed.torch.Loader(feed, device=device)
    val = open_validation(device)
    for epoch in loader.epochs():
        for x, y in loader:  # each `for` over a Loader is one epoch
            if 0 <= steps <= loader.step:
                continue  # take the epoch's other batches, train on none
            x = x.float().sub_(mean).div_(std)  # normalise on the device
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if loader.step % 10 == 0:
                print("rank %s epoch %d step %d loss %.3f images %s" % (
                    os.environ.get("RANK", 0), loader.epoch, loader.step, loss.item(), tuple(x.shape)), flush=True)
            del x, y
        if val is not None:
            say_top1(val, validate(model, val, mean, std, distributed), epoch)  # the epoch just trained
    loader.close()
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
