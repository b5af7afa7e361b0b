"""A small GPT trained through torchrun on a mixture of two token corpora,
fed by one ringfeed loader per machine (docs/tokens.md).

    # two corpora to try it on (a Megatron pair and a datatrove file):
    python examples/train_gpt.py --make-corpus /tmp/corpus

    # the loader and the job as one command:
    ringfeed run --source /tmp/corpus/web/corpus_text_document --source /tmp/corpus/books \\
        --weights 0.7,0.3 --seq-len 256 --batch-size 8 --epochs 2 \\
        -- torchrun --nproc-per-node 2 examples/train_gpt.py

Every sample is a window of L + 1 tokens (inputs and targets shifted by one)
drawn from the two corpora in proportions 0.7 and 0.3, in the corpora's own
dtype (uint16) through the ring. ringfeed.torch.Loader gives each batch as a
TokenBatch: the tokens as int64 on the device (converted after the copy),
and FlashAttention's `cu_seqlens` of the inputs, cut where a document starts.
The model attends only within a document, and its position ids restart at 0
at every document start (and at every window's start, where a document
begun in an earlier window continues): with flash_attn installed on a GPU,
through flash_attn_varlen_func; elsewhere through a block-diagonal causal
mask made from the same boundaries.

SMALL=1 makes the model tiny (CPU; with `--seq-len 64 --batch-size 4
--samples-per-epoch 480`, under a minute in CI: tests/python/test_train_gpt.py);
LOG=1 prints the first batches' document cuts and position ids; MAX_STEPS=N
stops after N steps. The loss is printed every 10 steps with the state to
resume from.
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

try:  # FlashAttention's varlen kernel, where it is installed (a GPU)
    from flash_attn import flash_attn_varlen_func
except ImportError:
    flash_attn_varlen_func = None

SMALL = os.environ.get("SMALL") == "1"
VOCAB = 512 if SMALL else 50304
DIM, LAYERS, HEADS = (64, 2, 2) if SMALL else (384, 6, 6)
MAX_STEPS = int(os.environ.get("MAX_STEPS", 1 << 62))


def position_ids(cu_seqlens, batch, length):
    """Each input token's position in its document: 0 at every cut."""
    cu = cu_seqlens.long()
    lengths = cu[1:] - cu[:-1]
    pos = torch.arange(batch * length, device=cu.device) - torch.repeat_interleave(cu[:-1], lengths)
    return pos.view(batch, length)


def document_mask(cu_seqlens, batch, length):
    """(B, 1, L, L) bool: token i may attend to j when j <= i in the same document piece."""
    cu = cu_seqlens.long()
    lengths = cu[1:] - cu[:-1]
    doc = torch.repeat_interleave(torch.arange(len(lengths), device=cu.device), lengths).view(batch, length)
    same = doc[:, :, None] == doc[:, None, :]
    causal = torch.ones(length, length, dtype=torch.bool, device=cu.device).tril()
    return (same & causal)[:, None]


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(DIM), torch.nn.LayerNorm(DIM)
        self.qkv = torch.nn.Linear(DIM, 3 * DIM)
        self.proj = torch.nn.Linear(DIM, DIM)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(DIM, 4 * DIM), torch.nn.GELU(), torch.nn.Linear(4 * DIM, DIM))

    def attend(self, x, mask, cu_seqlens, max_seqlen):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, HEADS, DIM // HEADS).unbind(2)
        if flash_attn_varlen_func is not None and x.is_cuda and x.dtype in (torch.float16, torch.bfloat16):
            # The windows packed end to end, cut at every document start.
            out = flash_attn_varlen_func(q.reshape(b * t, HEADS, -1), k.reshape(b * t, HEADS, -1),
                                         v.reshape(b * t, HEADS, -1), cu_seqlens, cu_seqlens, max_seqlen,
                                         max_seqlen, causal=True)
            return out.reshape(b, t, DIM)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
        return out.transpose(1, 2).reshape(b, t, DIM)

    def forward(self, x, mask, cu_seqlens, max_seqlen):
        x = x + self.proj(self.attend(self.ln1(x), mask, cu_seqlens, max_seqlen))
        return x + self.mlp(self.ln2(x))


class GPT(torch.nn.Module):
    def __init__(self, seq_len):
        super().__init__()
        self.tok = torch.nn.Embedding(VOCAB, DIM)
        self.pos = torch.nn.Embedding(seq_len, DIM)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln = torch.nn.LayerNorm(DIM)
        self.head = torch.nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, x, cu_seqlens, max_seqlen):
        b, t = x.shape
        h = self.tok(x) + self.pos(position_ids(cu_seqlens, b, t))
        mask = document_mask(cu_seqlens, b, t)
        for block in self.blocks:
            h = block(h, mask, cu_seqlens, max_seqlen)
        return self.head(self.ln(h))


def main():
    import ringfeed
    import ringfeed.torch

    distributed = "RANK" in os.environ
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if distributed:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank = int(os.environ.get("RANK", 0))
    feed = ringfeed.attach()  # RINGFEED_NAME, LOCAL_RANK
    if distributed:
        ringfeed.check_same_plan(feed)
    fmt = feed.info.tokens
    if fmt is None:
        sys.exit("train_gpt.py: the loader serves no token windows: start it with --seq-len L (docs/tokens.md)")
    seq_len = fmt.seq_len
    torch.manual_seed(0)
    model = GPT(seq_len).to(device)
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3 if SMALL else 6e-4)
    # int64 tokens on the device (uint16 in the ring), and the varlen cuts.
    loader = ringfeed.torch.Loader(feed, token_dtype=torch.int64, cu_seqlens=True, device=device)
    step = 0
    for batch in loader:
        x, y = batch.tokens[:, :-1], batch.tokens[:, 1:]
        if x.max() >= VOCAB:
            sys.exit("train_gpt.py: token %d is past this model's vocabulary of %d" % (int(x.max()), VOCAB))
        if os.environ.get("LOG") == "1" and rank == 0 and step < 3:
            cuts = batch.cu_seqlens.tolist()
            print("step %d: document pieces end at %s; position ids of window 0 start %s" % (
                step, cuts[1:8], position_ids(batch.cu_seqlens, len(x), seq_len)[0, :6].tolist()), flush=True)
        logits = model(x, batch.cu_seqlens, batch.max_seqlen)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if rank == 0 and step % 10 == 0:
            state = loader.resume_state
            print("epoch %d step %d loss %.3f (resume: --resume %d:%d)" % (
                loader.epoch, loader.step, loss.item(), state[0], state[1]), flush=True)
        step += 1
        if step >= MAX_STEPS:
            break
    loader.close()
    feed.close()
    if distributed:
        dist.destroy_process_group()


def make_corpus(root):
    """Two small corpora of documents a tiny model can learn: runs of counting
    by a per-document stride (mod VOCAB), as a Megatron pair (web) and a
    datatrove file (books), written in their published layouts."""
    import struct

    import numpy as np

    rng = np.random.default_rng(0)

    def doc():
        start, stride = int(rng.integers(0, 512)), int(rng.integers(1, 4))
        return ((start + stride * np.arange(int(rng.integers(20, 200)))) % 512).astype(np.uint16)

    web = [doc() for _ in range(800)]
    books = [doc() for _ in range(400)]
    os.makedirs(os.path.join(root, "web"), exist_ok=True)
    os.makedirs(os.path.join(root, "books"), exist_ok=True)
    prefix = os.path.join(root, "web", "corpus_text_document")
    with open(prefix + ".bin", "wb") as f:
        for d in web:
            f.write(d.tobytes())
    lengths = np.array([len(d) for d in web], dtype="<i4")
    pointers = np.concatenate([[0], np.cumsum(lengths.astype(np.int64) * 2)[:-1]]).astype("<i8")
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + bytes([8]))
        f.write(struct.pack("<QQ", len(web), len(web) + 1))
        f.write(lengths.tobytes() + pointers.tobytes() + np.arange(len(web) + 1, dtype="<i8").tobytes())
    with open(os.path.join(root, "books", "000_books.ds"), "wb") as f:
        for d in books:
            f.write(d.tobytes())
    ends = np.cumsum([len(d) for d in books]).astype("<u8")
    with open(os.path.join(root, "books", "000_books.ds.index"), "wb") as f:
        f.write(ends.tobytes())
    print("wrote %s/web/corpus_text_document.{bin,idx} (%d documents) and %s/books/000_books.ds (%d documents)"
          % (root, len(web), root, len(books)))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--make-corpus":
        make_corpus(sys.argv[2])
    else:
        main()
