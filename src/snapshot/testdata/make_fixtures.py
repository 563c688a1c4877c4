"""Regenerates the pickle fixtures used by src/snapshot/tests.rs.

Run from this folder with `python3 make_fixtures.py`. It only *writes* pickles
(pickle.dumps); it never loads the malicious ones.

- small_p{0..5}.pickle: one small snapshot, the same dict in every protocol,
  with shared (memoized) frames, a tuple, non-ASCII and escape-worthy strings,
  an `oom` entry, an action this crate does not know, a nested settings dict.
- evil_*.pickle: pickles that, when loaded by Python, would import a global
  and call it (or build a class instance, a set, an OrderedDict, a bytearray).
  The importer must reject every one of them.
"""
import collections
import os
import pickle

A = 2**47 + 4096
SEG = 2 * 1024 * 1024
F1 = {"filename": "train.py", "line": 21, "name": "gpt_train"}
F2 = {"filename": "odd 'name' \"q\" \\ back\nslash.py", "line": -1,
      "name": "caf\u00e9 \u2713 \U0001F600 <module>"}

snap = {
    "segments": [{
        "device": 0, "address": A, "total_size": SEG,
        "allocated_size": 1024, "active_size": 1536, "requested_size": 1500,
        "stream": 0, "segment_type": "small", "segment_pool_id": (0, 0),
        "is_expandable": False, "frames": [F1],
        "blocks": [
            {"address": A, "size": 1024, "requested_size": 1000,
             "state": "active_allocated", "frames": [F1, F2]},
            {"address": A + 1024, "size": 512, "requested_size": 500,
             "state": "active_pending_free", "frames": []},
            {"address": A + 1536, "size": SEG - 1536, "requested_size": 7,
             "state": "inactive", "frames": []},
        ],
    }],
    "device_traces": [[
        {"action": "segment_alloc", "addr": A, "size": SEG, "stream": 0,
         "time_us": 1796011111320232, "compile_context": "N/A",
         "user_metadata": "", "frames": [F1]},
        {"action": "alloc", "addr": A, "size": 1000, "stream": 0,
         "time_us": 1796011111320240, "compile_context": "N/A",
         "user_metadata": "", "frames": [F1, F2]},
        {"action": "alloc", "addr": A + 1024, "size": 500, "stream": 0,
         "time_us": 1796011111320250, "frames": []},
        {"action": "free_requested", "addr": A + 1024, "size": 500,
         "stream": 0, "time_us": 1796011111320260, "frames": []},
        {"action": "oom", "device_free": 123456, "size": 2**40, "stream": 0,
         "time_us": 1796011111320270, "frames": [F2]},
        {"action": "user_defined", "addr": 0, "size": 0, "stream": 0,
         "time_us": 1796011111320280, "frames": []},
    ]],
    "allocator_settings": {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False",
        "max_split_size": -1, "garbage_collection_threshold": 0.5,
        "expandable_segments": False, "none_value": None,
        "big": 2**63 + 5,
        "roundup_power2_divisions": {"1": 0, "2": 4},
    },
    "external_annotations": [{"stage": "START", "name": "step", "device": 0,
                              "time_us": 5}],
}

for proto in range(6):
    with open(f"small_p{proto}.pickle", "wb") as f:
        f.write(pickle.dumps(snap, protocol=proto))


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


class Plain:
    def __init__(self):
        self.x = 1


def evil_snapshot(obj):
    s = dict(snap)
    s["allocator_settings"] = dict(snap["allocator_settings"], evil=obj)
    return s


fixtures = {}
for proto in range(6):
    fixtures[f"evil_reduce_p{proto}"] = pickle.dumps(Evil(), protocol=proto)
for proto in (2, 4):
    fixtures[f"evil_set_p{proto}"] = pickle.dumps({1, 2}, protocol=proto)
    fixtures[f"evil_ordereddict_p{proto}"] = pickle.dumps(
        collections.OrderedDict(a=1), protocol=proto)
    fixtures[f"evil_object_p{proto}"] = pickle.dumps(Plain(), protocol=proto)
    fixtures[f"evil_bytearray_p{proto}"] = pickle.dumps(bytearray(b"ab"), protocol=proto)
    fixtures[f"evil_in_snapshot_p{proto}"] = pickle.dumps(evil_snapshot(Evil()), protocol=proto)
fixtures["evil_bytearray_p5"] = pickle.dumps(bytearray(b"ab"), protocol=5)
for name, data in fixtures.items():
    with open(name + ".pickle", "wb") as f:
        f.write(data)
