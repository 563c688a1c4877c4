"""More real PyTorch CUDA caching-allocator traces, for judging the pool's policy on workloads it was
not tuned on. Same method as ../shared/traces/capture.py: each workload in a fresh process, recording
from before the first CUDA allocation, python frames only.

usage (on the GPU machine): OUT=DIR python3 benches/torch/capture.py [NAME]
writes $OUT/NAME.pickle and $OUT/NAME.json (PyTorch's own memory_stats() peaks)."""
import json, os, pickle, subprocess, sys, time

OUT = os.environ["OUT"]
WORKLOADS = ["gpt_decode", "resnet_train", "mlp_varbatch_serve", "llm_prefill_varlen"]


def run(name):
    import torch, torch.nn as nn
    dev = "cuda"
    torch.manual_seed(0)
    torch.cuda.memory._record_memory_history(max_entries=200000, stacks="python")

    def gpt_decode():
        # autoregressive decoding with a growing key/value cache (torch.cat per token), prompts of
        # varying length, 8 sequences of up to 64 new tokens: every step's tensors grow by one row
        d, heads, layers, vocab = 1024, 16, 6, 32000
        emb = nn.Embedding(vocab, d).to(dev)
        blocks = nn.ModuleList([nn.ModuleDict({
            "qkv": nn.Linear(d, 3 * d), "out": nn.Linear(d, d),
            "up": nn.Linear(d, 4 * d), "down": nn.Linear(4 * d, d),
            "n1": nn.LayerNorm(d), "n2": nn.LayerNorm(d)}) for _ in range(layers)]).to(dev)
        head = nn.Linear(d, vocab).to(dev)
        g = torch.Generator().manual_seed(6)
        with torch.no_grad():
            for _ in range(8):
                b = int(torch.randint(1, 9, (1,), generator=g))
                prompt = int(torch.randint(16, 257, (1,), generator=g))
                new = int(torch.randint(32, 65, (1,), generator=g))
                tokens = torch.randint(0, vocab, (b, prompt), device=dev)
                cache = [None] * layers
                x = emb(tokens)
                for step in range(new):
                    for i, blk in enumerate(blocks):
                        h = blk["n1"](x)
                        q, k, v = blk["qkv"](h).view(b, -1, 3, heads, d // heads).unbind(2)
                        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
                        if cache[i] is not None:
                            k = torch.cat([cache[i][0], k], dim=2)
                            v = torch.cat([cache[i][1], v], dim=2)
                        cache[i] = (k, v)
                        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=(step == 0))
                        x = x + blk["out"](a.transpose(1, 2).reshape(b, -1, d))
                        x = x + blk["down"](nn.functional.gelu(blk["up"](blk["n2"](x))))
                    nxt = head(x[:, -1:]).argmax(-1)
                    x = emb(nxt)
                del cache, x

    def resnet_train():
        import torchvision
        model = torchvision.models.resnet50(weights=None).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for bs in [32, 64, 16, 48, 64]:
            x = torch.randn(bs, 3, 224, 224, device=dev); y = torch.randint(0, 1000, (bs,), device=dev)
            nn.functional.cross_entropy(model(x), y).backward(); opt.step(); opt.zero_grad(set_to_none=True)

    def mlp_varbatch_serve():
        # the pool_vs_naive `mlp` server's model, 600 requests of 1-512 rows, softmax read back
        widths = [1024, 4096, 4096, 4096, 1024]
        layers = []
        for a, b in zip(widths, widths[1:]):
            layers += [nn.Linear(a, b), nn.GELU(approximate="tanh")]
        model = nn.Sequential(*layers[:-1]).to(dev).eval()
        g = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for _ in range(600):
                b = int(torch.randint(1, 513, (1,), generator=g))
                model(torch.randn(b, 1024, device=dev)).softmax(-1).cpu()

    def llm_prefill_varlen():
        # a wider encoder (d=2048, 4 layers) over prompts of 64-2048 tokens, batch 1-4: large
        # activations whose sizes vary a lot from request to request
        layer = nn.TransformerEncoderLayer(2048, 16, 8192, batch_first=True, norm_first=True)
        model = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False).to(dev).eval()
        g = torch.Generator().manual_seed(8)
        with torch.no_grad():
            for _ in range(60):
                b = int(torch.randint(1, 5, (1,), generator=g)); s = int(torch.randint(64, 2049, (1,), generator=g))
                model(torch.randn(b, s, 2048, device=dev), is_causal=False).sum().item()

    t0 = time.time()
    {"gpt_decode": gpt_decode, "resnet_train": resnet_train, "mlp_varbatch_serve": mlp_varbatch_serve,
     "llm_prefill_varlen": llm_prefill_varlen}[name]()
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    for seg in snap.get("segments", []):
        for blk in seg.get("blocks", []):
            blk.pop("frames", None)
    for trace in snap["device_traces"]:
        for e in trace:
            e["frames"] = [{"filename": os.path.basename(f.get("filename", "")), "line": f.get("line", 0),
                            "name": f.get("name", "")} for f in e.get("frames", [])[:4]]
    st = torch.cuda.memory_stats()
    info = {"workload": name, "seconds": round(time.time() - t0, 2), "torch": torch.__version__,
            "device": torch.cuda.get_device_name(0),
            "peak_allocated": st["allocated_bytes.all.peak"], "peak_reserved": st["reserved_bytes.all.peak"],
            "peak_requested": st["requested_bytes.all.peak"], "num_alloc_retries": st["num_alloc_retries"],
            "segments_created": sum(1 for t in snap["device_traces"] for e in t if e["action"] == "segment_alloc"),
            "events": sum(len(t) for t in snap["device_traces"])}
    with open(f"{OUT}/{name}.pickle", "wb") as f: pickle.dump(snap, f, protocol=4)
    with open(f"{OUT}/{name}.json", "w") as f: json.dump(info, f)
    print(json.dumps(info), flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        run(sys.argv[1])
    else:
        for w in WORKLOADS:
            subprocess.run([sys.executable, __file__, w], check=False)
