"""PyTorch's side of `pool_vs_naive`: the same server, eager and with CUDA graphs, fp32 or fp16.

    python3 benches/torch/serve.py --large --json torch_serve.json
    python3 benches/torch/serve.py --large --only mlp --dtype half
    python3 benches/torch/serve.py --large --only mlp --tf32
    python3 benches/torch/serve.py --large --only small --width 256 --layers 16
    python3 benches/torch/serve.py --scale test

`--dtype half` keeps the weights, the inputs and every activation in torch.float16 (as
`pool_vs_naive --dtype f16`; cuBLAS multiplies them on the tensor cores); the default `float` is
float32. `--tf32` lets float32 matmuls use TF32 (`torch.backends.cuda.matmul.allow_tf32`, beside
`pool_vs_naive --f32-as-f16`); off by default.

The workloads are `pool_vs_naive`'s (`--scale test|default|large`, `--large` for large; `--only`,
`--width`, `--layers` as there). A request: `rows` drawn uniformly from the workload's batch range
(`random.Random(7)`), input `x[i] = ((i * 31 + request) % 17) / 17 - 0.5` over its `rows x
widths[0]` values, then per layer `x @ W + b` and GELU (all but the last layer), a softmax over the
last dimension, and the probabilities read back to the host. Weights [fan_in, fan_out] uniform in
±sqrt(1 / fan_in), biases [fan_out] in ±0.1 (seeded; once per workload, for both sides).
One request in flight. Every request's input is made before the timed loop, as a pinned host
tensor; each request copies it to the device (non_blocking) and its answer into a pinned host
buffer, then synchronizes.

- `eager`: the ops one by one; the caching allocator serves every intermediate.
- `cuda_graph`: one CUDA graph per batch size that the request sequence draws, captured before
  the requests (untimed; `capture_s`), all in one memory pool (`torch.cuda.graph_pool_handle()`).
  A request copies its input into a view of one static input buffer, replays its size's graph
  and copies that graph's static output to the host.

Timed: wall clock from the end of the warm-up (the first tenth of the requests, at least one) to
the last answer, as `pool_vs_naive` does; the checksum is computed inside that loop, as there.
The sides alternate (eager, cuda_graph, eager, ...) for 5 rounds (2 at `--scale test`); each
reports its median round. GELU: `--gelu tanh` (default) is the tanh approximation that our kernel
computes; `--gelu erf` is `torch.nn.functional.gelu`'s default.

The JSON: {"device", "torch", "dtype": "float" | "half", "tf32", "gelu", "workloads":
[{"workload": {"name", "widths", "batch": [lo, hi], "requests"}, "eager": SIDE, "cuda_graph": SIDE,
"speedup"}]}, with
SIDE = {"requests_per_s", "rounds_requests_per_s", "peak_allocated_bytes", "peak_reserved_bytes",
"weights_bytes", "capture_s", "graphs", "checksum"} (`capture_s` and `graphs` 0 for eager);
`checksum` = the sum over all requests (warm-up included) of sum_i p_i * (i % 7 + 1), in float64.
"""

import argparse
import json
import random
import time

import torch
import torch.nn.functional as F

MAX_WIDTH = 1 << 16
MAX_LAYERS = 1024


def workloads(scale):
    """`Scale::workloads()` of pool_vs_naive.rs."""
    mlp, mlp_requests, small, small_requests = {
        "test": ([16, 32, 8], 12, [16, 16, 16, 4], 20),
        "default": ([256, 512, 512, 64], 40, [128] * 7, 200),
        "large": ([1024, 4096, 4096, 4096, 1024], 400, [1024] * 9, 4000),
    }[scale]
    max_batch = 32 if scale == "test" else 512
    return [
        {"name": "mlp", "widths": mlp, "batch": [1, max_batch], "requests": mlp_requests},
        {"name": "small", "widths": small, "batch": [1, 8], "requests": small_requests},
    ]


def make_layers(widths, dtype):
    """Drawn in float32 (the same values whatever the dtype), then stored as `dtype`."""
    generator = torch.Generator(device="cuda").manual_seed(42)
    layers = []
    for fan_in, fan_out in zip(widths, widths[1:]):
        scale = (1.0 / fan_in) ** 0.5
        w = (torch.rand((fan_in, fan_out), device="cuda", generator=generator) * 2 - 1) * scale
        b = (torch.rand((fan_out,), device="cuda", generator=generator) * 2 - 1) * 0.1
        layers.append((w.to(dtype), b.to(dtype)))
    return layers


def forward(x, layers, gelu):
    for index, (w, b) in enumerate(layers):
        x = x @ w + b
        if index + 1 < len(layers):
            x = F.gelu(x, approximate=gelu)
    return torch.softmax(x, dim=-1)


def make_requests(workload, dtype):
    """Every request's rows and pinned input (of `dtype`), made before anything is timed."""
    rng = random.Random(7)
    width = workload["widths"][0]
    requests = []
    for request in range(workload["requests"]):
        rows = rng.randint(*workload["batch"])
        i = torch.arange(rows * width, dtype=torch.int64)
        values = ((i * 31 + request) % 17).to(torch.float32) / 17 - 0.5
        requests.append((rows, values.to(dtype).view(rows, width).pin_memory()))
    return requests


def capture(layers, gelu, requests, width):
    """One graph per batch size drawn, largest first, in one pool: {rows: (graph, in, out)}."""
    sizes = sorted({rows for rows, _ in requests}, reverse=True)
    pool = torch.cuda.graph_pool_handle()
    static_in = torch.zeros((sizes[0], width), device="cuda", dtype=requests[0][1].dtype)
    graphs = {}
    side = torch.cuda.Stream()
    for rows in sizes:
        x = static_in[:rows]
        # A warm-up run on a side stream first (cuBLAS's workspace and heuristics), as the
        # CUDA-graph documentation advises.
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            forward(x, layers, gelu)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            out = forward(x, layers, gelu)
        graphs[rows] = (graph, x, out)
    torch.cuda.synchronize()
    return graphs


def serve(side, workload, layers, gelu, requests):
    """One round of one side: its figures, with requests/s over the requests after the warm-up."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    widths = workload["widths"]
    max_rows = workload["batch"][1]
    dtype = layers[0][0].dtype
    host_out = torch.empty((max_rows, widths[-1]), dtype=dtype).pin_memory()
    # The checksum's weights, (i % 7) + 1 for i over the flattened answer.
    factors = (torch.arange(max_rows * widths[-1], dtype=torch.int64) % 7 + 1).to(torch.float64)
    stream = torch.cuda.current_stream()

    graphs, capture_s = {}, 0.0
    if side == "cuda_graph":
        started = time.perf_counter()
        graphs = capture(layers, gelu, requests, widths[0])
        capture_s = time.perf_counter() - started

    warmup = max(len(requests) // 10, 1)
    checksum = 0.0
    start = time.perf_counter()
    for request, (rows, host_in) in enumerate(requests):
        if request == warmup:
            torch.cuda.synchronize()
            start = time.perf_counter()
        if graphs:
            graph, static_in, static_out = graphs[rows]
            static_in.copy_(host_in, non_blocking=True)
            graph.replay()
            probabilities = static_out
        else:
            probabilities = forward(host_in.to("cuda", non_blocking=True), layers, gelu)
        answer = host_out[:rows]
        answer.copy_(probabilities, non_blocking=True)
        stream.synchronize()
        n = answer.numel()
        checksum += torch.dot(answer.view(-1).to(torch.float64), factors[:n]).item()
    torch.cuda.synchronize()
    elapsed = max(time.perf_counter() - start, 1e-9)
    weights_bytes = sum(t.numel() * t.element_size() for layer in layers for t in layer)
    figures = {
        "requests_per_s": (len(requests) - warmup) / elapsed,
        "rounds_requests_per_s": [],
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
        "weights_bytes": weights_bytes,
        "capture_s": capture_s,
        "graphs": len(graphs),
        "checksum": checksum,
    }
    return figures


def median_round(rounds):
    """The round of median requests/s (the lower middle, as pool_vs_naive), with every round's."""
    ordered = sorted(rounds, key=lambda r: r["requests_per_s"])
    every = [r["requests_per_s"] for r in rounds]
    return dict(ordered[(len(ordered) - 1) // 2], rounds_requests_per_s=every)


def print_table(eager, graph, speedup):
    mib = lambda b: f"{b / 2**20:.2f} MiB"
    print(f"\n{'':<28} {'eager':>16} {'cuda_graph':>16}")
    for label, show in [
        ("requests/s (median round)", lambda s: f"{s['requests_per_s']:.1f}"),
        ("peak allocated", lambda s: mib(s["peak_allocated_bytes"])),
        ("peak reserved", lambda s: mib(s["peak_reserved_bytes"])),
        ("weights", lambda s: mib(s["weights_bytes"])),
        ("graphs (capture s)", lambda s: f"{s['graphs']} ({s['capture_s']:.2f})"),
        ("checksum", lambda s: f"{s['checksum']:.6g}"),
    ]:
        print(f"{label:<28} {show(eager):>16} {show(graph):>16}")
    rounds = lambda s: ", ".join(f"{r:.0f}" for r in s["rounds_requests_per_s"])
    print(f"  every round: eager {rounds(eager)}; cuda_graph {rounds(graph)}")
    print(f"speedup (cuda_graph requests/s over eager): {speedup:.2f}x")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", choices=["test", "default", "large"], default="default")
    parser.add_argument("--large", action="store_true", help="same as --scale large")
    parser.add_argument("--only", choices=["small", "mlp"], help="run one workload")
    parser.add_argument("--width", type=int, help="the small workload's width (a multiple of 4)")
    parser.add_argument("--layers", type=int, help="the small workload's number of layers")
    parser.add_argument("--gelu", choices=["tanh", "erf"], default="tanh")
    parser.add_argument(
        "--dtype",
        choices=["float", "half"],
        default="float",
        help="weights, inputs and activations in float32 (default) or float16",
    )
    parser.add_argument(
        "--tf32", action="store_true", help="let float32 matmuls use TF32 (off by default)"
    )
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    if args.width is not None and not (0 < args.width <= MAX_WIDTH and args.width % 4 == 0):
        parser.error(f"--width needs a multiple of 4 up to {MAX_WIDTH}, not {args.width}")
    if args.layers is not None and not 0 < args.layers <= MAX_LAYERS:
        parser.error(f"--layers needs 1 to {MAX_LAYERS}, not {args.layers}")
    if (args.width or args.layers) and args.only == "mlp":
        parser.error("--width and --layers shape the small workload, which --only mlp leaves out")
    if not torch.cuda.is_available():
        raise SystemExit("serve.py: no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    torch.set_float32_matmul_precision("high" if args.tf32 else "highest")
    dtype = {"float": torch.float32, "half": torch.float16}[args.dtype]
    # The sides' checksums agree to float32's precision, or float16's (or TF32's, whose
    # rounding of the operands may differ with the kernel that cuBLAS picks in a graph).
    tolerance = 1e-4 if args.dtype == "float" and not args.tf32 else 1e-2
    scale = "large" if args.large else args.scale
    gelu = "tanh" if args.gelu == "tanh" else "none"

    name = torch.cuda.get_device_name()
    precision = "fp16" if args.dtype == "half" else "fp32"
    tf32 = "on" if args.tf32 else "off"
    print(f"device: {name}, torch {torch.__version__}, {precision}, TF32 {tf32}, GELU {args.gelu}")
    results = []
    for workload in workloads(scale):
        if args.only and workload["name"] != args.only:
            continue
        if workload["name"] == "small" and (args.width or args.layers):
            width = args.width or workload["widths"][0]
            workload["widths"] = [width] * ((args.layers or len(workload["widths"]) - 1) + 1)
        lo, hi = workload["batch"]
        print(f"\n== {workload['name']}: widths {workload['widths']}, "
              f"batches of {lo} to {hi} rows, {workload['requests']} requests")
        layers = make_layers(workload["widths"], dtype)
        requests = make_requests(workload, dtype)
        rounds = {"eager": [], "cuda_graph": []}
        for _ in range(2 if scale == "test" else 5):
            for side in rounds:
                rounds[side].append(serve(side, workload, layers, gelu, requests))
        eager, graph = median_round(rounds["eager"]), median_round(rounds["cuda_graph"])
        relative = abs(eager["checksum"] - graph["checksum"]) / max(abs(eager["checksum"]), 1.0)
        if relative > tolerance:
            sums = f"{eager['checksum']} and {graph['checksum']}"
            raise SystemExit(f"eager and cuda_graph disagree: checksums {sums}")
        speedup = graph["requests_per_s"] / eager["requests_per_s"]
        print_table(eager, graph, speedup)
        results.append(
            {"workload": workload, "eager": eager, "cuda_graph": graph, "speedup": speedup}
        )
        del layers, requests

    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "device": name,
                    "torch": torch.__version__,
                    "dtype": args.dtype,
                    "tf32": args.tf32,
                    "gelu": args.gelu,
                    "workloads": results,
                },
                f,
                indent=1,
            )
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
