"""Train an image classifier with torchrun, the loader decoding the images.

    ringfeed run --source /data/imagenet/train --batch-size 64 --epochs 90 \
        --decode image --crop random-resized:224 --flip \
        -- torchrun --nproc-per-node 8 examples/train_images.py

The loader decodes every JPEG, PNG or WebP, takes torchvision's
RandomResizedCrop(224) and a horizontal flip drawn from (seed, epoch, sample)
alone, and writes a (3, 224, 224) uint8 image per sample straight into the
ring, with each batch's labels (the class directory, as ImageFolder numbers
them). Each rank gets (images, labels) from ringfeed.torch.Loader with no
argument: on the GPU, copied once from the pinned ring. Normalisation is two
lines on the device. The trainer decodes nothing.

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
    classes = max(images.classes, 1)
    model = resnet18(classes, width=8 if os.environ.get("SMALL") else 64).to(device)
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    mean, std = MEAN.to(device), STD.to(device)
    steps = int(os.environ.get("STEPS", -1))
    loader = ringfeed.torch.Loader(feed, device=device)
    for x, y in (batch for _epoch in loader.epochs() for batch in loader):  # each `for` over a Loader is one epoch
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
    loader.close()
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
