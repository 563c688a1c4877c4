#!/usr/bin/env python3
"""A model of what virtual memory would allow, for the segment target of issue 15.

One address space with best-fit placement over coalesced free ranges (the replay's
`best_fit_heap_peak_bytes`), backed by chunks of C bytes that are mapped while any live byte lies
in them, as PyTorch's expandable segments map physical pages under one virtual range. A chunk that
empties stays mapped (cached, least recently emptied first out) while the mapped bytes stay within
1/H over the most bytes ever requested at once. Each mapping counts as one segment created.
wgpu 30 has no sparse binding, so no wgpu pool can run this: it bounds what the pool could reach
with it.

    python3 benches/models/mapped_heap.py TRACE.pickle [TRACE.pickle ...]
    CHUNKS_MIB="16 64" HEADROOMS="32 8" python3 benches/models/mapped_heap.py ...

Prints, per trace, chunk size and headroom: peak mapped / peak requested, and mappings.
Requests are rounded up to 256 bytes (the pool's block on the H200).
"""

import bisect
import os
import pickle
import sys
from collections import OrderedDict

BLOCK = 256


def events(path):
    """The alloc and free events of a PyTorch snapshot (pickle), as (action, addr, size)."""
    with open(path, "rb") as f:
        snapshot = pickle.load(f)
    return [
        (e["action"], e["addr"], e["size"])
        for e in snapshot["device_traces"][0]
        if e["action"] in ("alloc", "free_completed")
    ]


def replay(trace, chunk, headroom):
    """(peak mapped / peak requested, chunks mapped) for one trace."""
    free = []  # (start, length), by start
    top = 0
    live = {}
    requested = high_water = 0
    users = {}  # chunk -> live allocations overlapping it
    mapped = set()
    cached = OrderedDict()  # emptied chunks still mapped, oldest first
    mappings = peak = 0

    def chunks_of(start, length):
        return range(start // chunk, (start + length - 1) // chunk + 1)

    def evict():
        ceiling = high_water + high_water // headroom
        while len(mapped) * chunk > ceiling and cached:
            c, _ = cached.popitem(last=False)
            mapped.discard(c)

    for action, addr, size in trace:
        if action == "alloc":
            length = -(-size // BLOCK) * BLOCK
            if length == 0:
                continue
            requested += length
            high_water = max(high_water, requested)
            best = None
            for i, (_, free_length) in enumerate(free):
                if free_length >= length and (best is None or free_length < free[best][1]):
                    best = i
            if best is None:
                start, top = top, top + length
            else:
                start, free_length = free[best]
                if free_length == length:
                    free.pop(best)
                else:
                    free[best] = (start + length, free_length - length)
            live[addr] = (start, length)
            for c in chunks_of(start, length):
                users[c] = users.get(c, 0) + 1
                if c in cached:
                    del cached[c]
                elif c not in mapped:
                    mapped.add(c)
                    mappings += 1
            evict()
            peak = max(peak, len(mapped) * chunk)
        elif addr in live:
            start, length = live.pop(addr)
            requested -= length
            for c in chunks_of(start, length):
                users[c] -= 1
                if users[c] == 0:
                    del users[c]
                    cached[c] = True
            evict()
            i = bisect.bisect(free, (start, 0))
            if i < len(free) and free[i][0] == start + length:
                length += free.pop(i)[1]
            if i > 0 and free[i - 1][0] + free[i - 1][1] == start:
                before, before_length = free.pop(i - 1)
                start, length, i = before, length + before_length, i - 1
            free.insert(i, (start, length))
            if free[-1][0] + free[-1][1] == top:
                top = free.pop()[0]
    return peak / high_water, mappings


def main():
    chunks = [int(x) << 20 for x in os.environ.get("CHUNKS_MIB", "16 32 64 128 256").split()]
    headrooms = [int(x) for x in os.environ.get("HEADROOMS", "32 8").split()]
    for path in sys.argv[1:]:
        trace = events(path)
        cells = []
        for chunk in chunks:
            for headroom in headrooms:
                ratio, mappings = replay(trace, chunk, headroom)
                cells.append(f"{chunk >> 20} MiB 1/{headroom}: {ratio:.3f} / {mappings}")
        print(os.path.basename(path), "|", " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
