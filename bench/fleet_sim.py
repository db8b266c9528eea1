#!/usr/bin/env python3
"""Hit ratio against node count for the fleet layouts of docs/scaling.md, on a Zipf workload.

Each node has an LRU memory cache of CAPACITY objects (all objects the same size). Layouts:

- `balanced`: a load balancer spreads requests evenly; every node caches on its own.
- `balanced+shared`: the same, with larder's shared tier: a node's miss is answered by the shared
  tier when any node fetched the object before (it holds everything: Redis sized for the set).
- `sharded`: requests for an object always reach the same node (consistent hashing, larder's
  `balance = "hash"` in a tier of larder nodes in front, or Varnish's shard director): the
  fleet's memory adds up, each object is held once.

Prints, per node count, the share of requests that reach the origin and the share answered from
a node's own memory. Deterministic (fixed seed). Usage: bench/fleet_sim.py [--requests N]
"""
import argparse
import bisect
import collections
import random


def zipf_sampler(n, alpha, rng):
    weights = [1.0 / (i + 1) ** alpha for i in range(n)]
    total = sum(weights)
    cdf, acc = [], 0.0
    for w in weights:
        acc += w / total
        cdf.append(acc)
    return lambda: min(bisect.bisect_left(cdf, rng.random()), n - 1)


class Lru:
    def __init__(self, capacity):
        self.capacity, self.d = capacity, collections.OrderedDict()

    def get(self, k):
        if k in self.d:
            self.d.move_to_end(k)
            return True
        return False

    def put(self, k):
        self.d[k] = True
        self.d.move_to_end(k)
        if len(self.d) > self.capacity:
            self.d.popitem(last=False)


def run(layout, nodes, requests, objects, capacity, alpha, seed):
    rng = random.Random(seed)
    sample = zipf_sampler(objects, alpha, rng)
    caches = [Lru(capacity) for _ in range(nodes)]
    shared = set()
    origin = local = 0
    for i in range(requests):
        k = sample()
        node = hash((k, 7919)) % nodes if layout == "sharded" else i % nodes
        c = caches[node]
        if c.get(k):
            local += 1
            continue
        if layout == "balanced+shared" and k in shared:
            c.put(k)
            continue
        origin += 1
        shared.add(k)
        c.put(k)
    return origin / requests, local / requests


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=400_000)
    p.add_argument("--objects", type=int, default=100_000)
    p.add_argument("--capacity", type=int, default=5_000)
    p.add_argument("--alpha", type=float, default=0.9)
    a = p.parse_args()
    print(f"Zipf alpha {a.alpha}, {a.objects} objects, {a.capacity} per node, {a.requests} requests\n")
    print("| nodes | layout | to the origin | from the node's memory |")
    print("| ---: | --- | ---: | ---: |")
    for nodes in (1, 2, 3, 4, 6, 8):
        for layout in ("balanced", "balanced+shared", "sharded"):
            o, l = run(layout, nodes, a.requests, a.objects, a.capacity, a.alpha, 42)
            print(f"| {nodes} | {layout} | {o:.1%} | {l:.1%} |")


if __name__ == "__main__":
    main()
