#!/usr/bin/env python3
"""Hit rates of cache admission policies under ringfeed's orders: a fresh random
permutation of N samples every epoch, a cache of C samples. Prints a Markdown
table for docs/cache.md.

    python3 bench/cache_sim.py [--n 10000] [--epochs 6] [--seed 0]

Policies:
- fixed subset (ringfeed): admit in order of arrival until full, then keep;
- LRU: admit every miss, evict the least recently used;
- FIFO: admit every miss, evict the oldest admitted;
- random eviction: admit every miss, evict a random entry.
Every policy here admits an object only when it is read (a miss fetches it).
Epoch 1 (a cold cache) is left out of the hit rates.
"""
import argparse
import random
from collections import OrderedDict


def fixed_subset(orders, cap):
    cache, hits = set(), []
    for order in orders:
        h = 0
        for x in order:
            if x in cache:
                h += 1
            elif len(cache) < cap:
                cache.add(x)
        hits.append(h)
    return hits


def lru(orders, cap):
    cache, hits = OrderedDict(), []
    for order in orders:
        h = 0
        for x in order:
            if x in cache:
                h += 1
                cache.move_to_end(x)
            else:
                cache[x] = None
                if len(cache) > cap:
                    cache.popitem(last=False)
        hits.append(h)
    return hits


def fifo(orders, cap):
    cache, hits = OrderedDict(), []
    for order in orders:
        h = 0
        for x in order:
            if x in cache:
                h += 1
            else:
                cache[x] = None
                if len(cache) > cap:
                    cache.popitem(last=False)
        hits.append(h)
    return hits


def random_evict(orders, cap, rng):
    slots, where, hits = [], {}, []
    for order in orders:
        h = 0
        for x in order:
            if x in where:
                h += 1
            elif len(slots) < cap:
                where[x] = len(slots)
                slots.append(x)
            else:
                i = rng.randrange(cap)
                del where[slots[i]]
                slots[i] = x
                where[x] = i
        hits.append(h)
    return hits


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    orders = []
    for _ in range(a.epochs):
        o = list(range(a.n))
        rng.shuffle(o)
        orders.append(o)
    print("N = %d samples, %d epochs, a fresh permutation each; hit rate of epochs 2..%d (mean)\n" % (a.n, a.epochs, a.epochs))
    print("| C/N | bound C/N | fixed subset (ringfeed) | LRU | FIFO | random eviction |")
    print("|---|---|---|---|---|---|")
    for ratio in (0.1, 0.25, 0.5, 0.75, 0.9):
        cap = int(a.n * ratio)
        row = []
        for hits in (fixed_subset(orders, cap), lru(orders, cap), fifo(orders, cap),
                     random_evict(orders, cap, random.Random(a.seed + 1))):
            later = hits[1:]
            row.append(100.0 * sum(later) / (len(later) * a.n))
        print("| %.2f | %.0f%% | %s |" % (ratio, 100 * ratio, " | ".join("%.1f%%" % r for r in row)))


if __name__ == "__main__":
    main()
