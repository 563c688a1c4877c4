"""Differential check of the Rust pickle importer against CPython's pickle.

    python3 differential.py write DIR N   # N random objects x protocols 0..5 into DIR
    DIFF_DIR=DIR cargo test --lib snapshot::tests::differential_against_python -- --ignored
    python3 differential.py compare DIR

Objects are plain data (dict with str keys, list, tuple, str, int, float, bool, None),
with shared sub-objects so that the pickles use the memo.
"""
import json
import math
import os
import pickle
import random
import sys


def rand_str(rng):
    alphabet = "ab\\\n\r\t'\"\x00\x1a \u00e9\u00ff\u0100\u2713\U0001F600\ud7ff"
    return "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 8)))


def rand_int(rng):
    bits = rng.choice([1, 7, 8, 15, 16, 31, 32, 33, 62, 63, 64])
    value = rng.randrange(0, 2**bits)
    if rng.random() < 0.4 and value < 2**63:
        value = -value - (1 if bits == 63 else 0)
    return value


def rand_obj(rng, depth, shared):
    kinds = ["int", "float", "str", "bool", "none"]
    if depth < 5:
        kinds += ["list", "tuple", "dict", "shared"] * 2
    kind = rng.choice(kinds)
    if kind == "int":
        return rand_int(rng)
    if kind == "float":
        return rng.choice([0.0, -0.0, 1.5, 1e300, -2.5e-300, rng.random() * 1e6, 5e-324])
    if kind == "str":
        return rand_str(rng)
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "none":
        return None
    if kind == "shared" and shared:
        return rng.choice(shared)
    n = rng.randrange(0, 5)
    if kind == "dict":
        obj = {rand_str(rng): rand_obj(rng, depth + 1, shared) for _ in range(n)}
    else:
        items = [rand_obj(rng, depth + 1, shared) for _ in range(n)]
        obj = tuple(items) if kind == "tuple" else items
    shared.append(obj)
    return obj


def to_json_value(obj):
    if isinstance(obj, dict):
        return {k: to_json_value(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_json_value(v) for v in obj]
    return obj


def write(folder, count):
    os.makedirs(folder, exist_ok=True)
    rng = random.Random(1234)
    for i in range(count):
        obj = rand_obj(rng, 0, [])
        snapshot = {"segments": [], "allocator_settings": {"x": obj}}
        for protocol in range(6):
            with open(os.path.join(folder, f"{i}_p{protocol}.pickle"), "wb") as f:
                pickle.dump(snapshot, f, protocol=protocol)


def same(a, b):
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, float) and isinstance(b, float) and a == b and (
            math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(same, a, b))
    return type(a) == type(b) and a == b


def compare(folder):
    ok = bad = 0
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".pickle"):
            continue
        base = os.path.join(folder, name[: -len(".pickle")])
        with open(base + ".pickle", "rb") as f:
            expected = to_json_value(pickle.load(f)["allocator_settings"]["x"])
        if os.path.exists(base + ".rust.err"):
            bad += 1
            print("ERROR", name, open(base + ".rust.err").read()[:200])
            continue
        with open(base + ".rust.json") as f:
            found = json.load(f)
        if same(expected, found):
            ok += 1
        else:
            bad += 1
            print("DIFF", name, repr(expected)[:200], repr(found)[:200])
    print(f"{ok} equal, {bad} different")


if __name__ == "__main__":
    {"write": lambda: write(sys.argv[2], int(sys.argv[3])), "compare": lambda: compare(sys.argv[2])}[sys.argv[1]]()
