"""A trainer for the token tests (issue 38): takes every batch of its rank
and saves, per batch, what test_tokens.py checks, to OUT (a pickle): epoch,
step, the window indices, their tokens, document starts and counts, the
resume state and the varlen boundaries. One process per rank, as torchrun
runs them."""
import pickle
import sys

import numpy as np

import ringfeed


def main():
    name, rank, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    rows = []
    with ringfeed.attach(name=name, rank=rank, timeout=60) as feed:
        fmt = feed.info.tokens
        assert fmt is not None, "the loader says no token format"
        for batch in feed:
            counts = batch.doc_counts.copy()
            starts = batch.doc_starts.copy()
            rows.append({
                "epoch": batch.epoch,
                "step": batch.step,
                "rank": rank,
                "indices": batch.indices.tolist(),
                "tokens": batch.tokens.astype(np.uint64),
                "starts": [starts[i, : min(int(c), fmt.doc_starts_max)].tolist() for i, c in enumerate(counts)],
                "counts": counts.tolist(),
                "resume_state": batch.resume_state,
                "cu_seqlens": batch.cu_seqlens(),
            })
            batch.release()
    with open(out, "wb") as f:
        pickle.dump(rows, f)


if __name__ == "__main__":
    main()
