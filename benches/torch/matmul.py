"""PyTorch's side of `bench_kernels`' matmul figures, on the same GPU: fp32 products, TF32 off.

    python3 benches/torch/matmul.py --serving --json torch.json
    python3 benches/torch/matmul.py --shape 8x1024x1024 --shape 4096x4096x4096 --json torch.json
    python3 benches/torch/matmul.py --serving --dtype half --json torch_half.json

`--dtype half` measures fp16 products (operands and results in `torch.half`; cuBLAS accumulates
in fp32 and uses the tensor cores, as a user of `half` gets), the figures `bench_kernels --dtype
f16 --torch torch_half.json` compares its f16 kernels with.

Then `bench_kernels --serving --torch torch.json` prints PyTorch's time beside each of its own and
the ratio. Time per product: CUDA events around each of `--runs` products recorded back to back
(after `--warmup` products), the median and the mean; the same operands every run, as
`bench_kernels` does. `chain_step_us`: the wall time that each further dependent product of
8x1024x1024 adds to a chain whose result is copied to the host (chains of 1 and of 65, medians of
`--chains` each), the figure `bench_kernels` reports as `matmul_chain_step_us`.

`stream_us`: the time per product in a stream, as `bench_kernels` measures its own: as many
products as take about 2 ms back to back between two CUDA events, divided by their number, the
median of five.

The JSON: {"device", "torch", "tf32", "dtype" ("float32" or "float16"), "matmul": [{"m", "n",
"k", "time_us", "mean_us", "gflops", "stream_us"}], "chain_step_us", "chain_single_us"}.

    python3 benches/torch/matmul.py --serving --elementwise --json torch.json

`--elementwise` also times the ops of `bench_kernels`' element-wise section on `--n` elements
(1M, 4M, 16M and 64M without one): `add`, `relu`, `gelu` (tanh approximation) and `sum` over rows
of 4096 (a pure read), each per op (events around each, median) and in a stream as above; the
JSON gains "elementwise": [{"op", "n", "time_us", "stream_us", "gbs", "stream_gbs"}] (bytes read
and written), which `bench_kernels --torch FILE` prints beside its own.

    python3 benches/torch/matmul.py --sustained 10 --shape 4096x4096x4096 --json torch_sustained.json

`--sustained SECS` measures instead each `--shape` (4096x4096x4096 without one) back to back for
SECS seconds, as `bench_kernels --sustained SECS` does: batches of about 20 ms of products, each
launched and synchronised, timed by the wall clock; TFLOP/s over the run and over each whole
second. The JSON then holds "sustained": [{"m", "n", "k", "seconds", "products", "tflops",
"windows_tflops"}] and an empty "matmul" list; `bench_kernels --sustained SECS --torch FILE`
prints the ratio.
"""

import argparse
import json
import statistics
import time

import torch

# The shapes of a server's products (batch x out x in), as `bench_kernels --serving` lists them.
SERVING = [
    (1, 4096, 4096),
    (8, 4096, 4096),
    (64, 4096, 4096),
    (128, 4096, 4096),
    (256, 4096, 4096),
    (512, 4096, 4096),
    (256, 4096, 1024),
    (256, 1024, 4096),
    (8, 1024, 1024),
    (4096, 4096, 4096),
]


def parse_shape(text):
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not MxNxK")
    return tuple(int(p) for p in parts)


# `--dtype` names and the torch types they select.
DTYPES = {"float": torch.float32, "half": torch.float16}


def time_product(m, n, k, runs, warmup, dtype):
    generator = torch.Generator(device="cuda").manual_seed(42)
    a = (torch.rand((m, k), device="cuda", generator=generator) * 2 - 1).to(dtype)
    b = (torch.rand((k, n), device="cuda", generator=generator) * 2 - 1).to(dtype)
    for _ in range(warmup):
        a @ b
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    for start, end in zip(starts, ends):
        start.record()
        a @ b
        end.record()
    torch.cuda.synchronize()
    times_us = [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]
    stream = stream_us(lambda: a @ b, statistics.median(times_us))
    return statistics.median(times_us), statistics.fmean(times_us), stream


def stream_us(run, each_us):
    """µs per `run()` in a stream: as many runs as take about 2 ms (each about `each_us`) between
    two CUDA events, divided by their number; the median of five such batches."""
    count = max(4, min(4096, round(2000 / max(each_us, 1e-3) + 0.5)))
    stream = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(count):
            run()
        end.record()
        torch.cuda.synchronize()
        stream.append(start.elapsed_time(end) * 1e3 / count)
    return statistics.median(stream)


def sustained(m, n, k, seconds, dtype):
    generator = torch.Generator(device="cuda").manual_seed(42)
    a = (torch.rand((m, k), device="cuda", generator=generator) * 2 - 1).to(dtype)
    b = (torch.rand((k, n), device="cuda", generator=generator) * 2 - 1).to(dtype)
    a @ b
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(4):
        a @ b
    torch.cuda.synchronize()
    each = (time.perf_counter() - started) / 4
    batch = max(1, min(10_000, round(0.02 / max(each, 1e-9) + 0.5)))
    flops = 2.0 * m * n * k
    windows = []
    products = window_products = 0
    started = time.perf_counter()
    window_start = 0.0
    while True:
        for _ in range(batch):
            a @ b
        torch.cuda.synchronize()
        products += batch
        window_products += batch
        now = time.perf_counter() - started
        if now - window_start >= 1.0:
            windows.append(window_products * flops / (now - window_start) / 1e12)
            window_start = now
            window_products = 0
        if now >= seconds:
            break
    elapsed = time.perf_counter() - started
    return {
        "m": m,
        "n": n,
        "k": k,
        "seconds": elapsed,
        "products": products,
        "tflops": products * flops / elapsed / 1e12,
        "windows_tflops": windows,
    }


# The element-wise ops of `bench_kernels`, and the bytes each reads and writes per element.
SUM_COLS = 4096
ELEMENTWISE = {
    "add": (lambda a, b: a + b, 3.0),
    "relu": (lambda a, b: torch.relu(a), 2.0),
    "gelu": (lambda a, b: torch.nn.functional.gelu(a, approximate="tanh"), 2.0),
    "sum": (lambda a, b: a.view(-1, SUM_COLS).sum(dim=1), 1.0 + 1.0 / SUM_COLS),
}


def time_elementwise(name, n, runs, warmup, dtype):
    """Per op (events around each, median) and in a stream (as `time_product`), in µs."""
    op, _ = ELEMENTWISE[name]
    generator = torch.Generator(device="cuda").manual_seed(42)
    a = (torch.rand(n, device="cuda", generator=generator) * 2 - 1).to(dtype)
    b = (torch.rand(n, device="cuda", generator=generator) * 2 - 1).to(dtype)
    for _ in range(warmup):
        op(a, b)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    for start, end in zip(starts, ends):
        start.record()
        op(a, b)
        end.record()
    torch.cuda.synchronize()
    each_us = statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends))
    return each_us, stream_us(lambda: op(a, b), each_us)


def chain_us(length, repeats, x0, w):
    times = []
    for round_ in range(repeats + 5):
        started = time.perf_counter()
        x = x0 @ w
        for _ in range(1, length):
            x = x @ w
        x.cpu()
        elapsed = (time.perf_counter() - started) * 1e6
        if round_ >= 5:
            times.append(elapsed)
    return statistics.median(times)


def write_json(path, dtype_name, **figures):
    """Writes the device, the versions and `figures` to `path` (nothing without one)."""
    if not path:
        return
    with open(path, "w") as f:
        json.dump(
            {
                "device": torch.cuda.get_device_name(),
                "torch": torch.__version__,
                "tf32": False,
                "dtype": dtype_name,
                **figures,
            },
            f,
            indent=1,
        )
    print(f"wrote {path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serving", action="store_true", help="the serving shapes (default)")
    parser.add_argument("--shape", type=parse_shape, action="append", default=[], help="MxNxK")
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--chains", type=int, default=101)
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument(
        "--sustained", type=float, help="instead: each shape back to back for this many seconds"
    )
    parser.add_argument(
        "--dtype", choices=sorted(DTYPES), default="float", help="operands' type (default float)"
    )
    parser.add_argument(
        "--elementwise", action="store_true", help="also the element-wise ops and the row sum"
    )
    parser.add_argument(
        "--n", type=int, action="append", default=[], help="element-wise sizes (multiples of 4096)"
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("matmul.py: no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dtype = DTYPES[args.dtype]
    dtype_name = str(dtype).removeprefix("torch.")

    shapes = list(args.shape)
    if args.sustained is not None:
        if not args.sustained > 0:
            raise SystemExit("matmul.py: --sustained needs a positive number of seconds")
        print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, {dtype_name}, TF32 off")
        print(f"{'M':>6} {'N':>6} {'K':>6} {'products':>9} {'TFLOP/s':>8} {'first s':>8} {'last s':>8} {'min s':>8}")
        rows = []
        for m, n, k in shapes or [(4096, 4096, 4096)]:
            row = sustained(m, n, k, args.sustained, dtype)
            windows = row["windows_tflops"] or [row["tflops"]]
            print(
                f"{m:>6} {n:>6} {k:>6} {row['products']:>9} {row['tflops']:>8.2f} {windows[0]:>8.2f} "
                f"{windows[-1]:>8.2f} {min(windows + [row['tflops']]):>8.2f}"
            )
            rows.append(row)
        write_json(args.json, dtype_name, matmul=[], sustained=rows)
        return
    if args.serving or not shapes:
        shapes = SERVING + [s for s in shapes if s not in SERVING]
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, {dtype_name}, TF32 off")
    print(f"{'M':>6} {'N':>6} {'K':>6} {'median (µs)':>12} {'mean (µs)':>10} {'GFLOP/s':>10} {'stream (µs)':>12}")
    results = []
    for m, n, k in shapes:
        median, mean, stream = time_product(m, n, k, args.runs, args.warmup, dtype)
        gflops = 2 * m * n * k / (median * 1e3)
        print(f"{m:>6} {n:>6} {k:>6} {median:>12.1f} {mean:>10.1f} {gflops:>10.1f} {stream:>12.1f}")
        results.append(
            {"m": m, "n": n, "k": k, "time_us": median, "mean_us": mean, "gflops": gflops, "stream_us": stream}
        )

    generator = torch.Generator(device="cuda").manual_seed(7)
    x0 = (torch.rand((8, 1024), device="cuda", generator=generator) * 2 - 1).to(dtype)
    # Scaled so that values stay finite along the chain.
    w = ((torch.rand((1024, 1024), device="cuda", generator=generator) * 2 - 1) / 32).to(dtype)
    single = chain_us(1, args.chains, x0, w)
    long = chain_us(65, args.chains, x0, w)
    step = (long - single) / 64
    print(f"chain of 8x1024x1024 products read back: {single:.1f} µs for one, {step:.2f} µs per further product")

    elementwise = []
    if args.elementwise:
        sizes = args.n or [1 << 20, 1 << 22, 1 << 24, 1 << 26]
        if any(n <= 0 or n % SUM_COLS for n in sizes):
            raise SystemExit(f"matmul.py: --n needs positive multiples of {SUM_COLS}")
        print(f"{'op':<8} {'n':>10} {'median (µs)':>12} {'GB/s':>9} {'stream (µs)':>12} {'GB/s':>9}")
        size = torch.tensor([], dtype=dtype).element_size()
        for name, (_, accesses) in ELEMENTWISE.items():
            for n in sizes:
                time_us, stream_us = time_elementwise(name, n, args.runs, args.warmup, dtype)
                moved = accesses * size * n
                gbs, stream_gbs = moved / (time_us * 1e3), moved / (stream_us * 1e3)
                print(f"{name:<8} {n:>10} {time_us:>12.1f} {gbs:>9.1f} {stream_us:>12.1f} {stream_gbs:>9.1f}")
                elementwise.append(
                    {"op": name, "n": n, "time_us": time_us, "stream_us": stream_us, "gbs": gbs, "stream_gbs": stream_gbs}
                )

    write_json(
        args.json,
        dtype_name,
        matmul=results,
        chain_single_us=single,
        chain_step_us=step,
        elementwise=elementwise,
    )


if __name__ == "__main__":
    main()
