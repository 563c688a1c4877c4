"""Tests of serve_gpt.py on the CPU, with plain python (no pytest):

    python3 benches/torch/test_serve_gpt.py

A tiny random GPT-2 (2 layers, 64 wide, 4 heads, n_ctx 128, vocab 256; weights normal with std
0.02, layer norms' weights 1, biases 0) written as safetensors by this file, and a seeded stream.
Checked: the model's forward against an independent float64 one written from GPT-2's
definition (sharper random weights); the continuous-batching server's greedy tokens equal a
no-cache full-recompute reference's for every request (max batch 1, 3, 4, 16); the batched
decode step's logits equal the reference's (cache slots of different lengths, stale values in
the cache, and again after a slot moves); the script end to end (--json,
--check with an identical and an altered side); arrivals replayed (no request admitted before it
arrives, the same tokens, TTFT from arrival, goodput against the stream's objective and the
flags'); the goodput count on hand-made latencies; the `transformer.` prefix and F16/BF16 data;
and that bad input (a truncated file, a missing or misshapen tensor, no metadata, a prompt too
long for n_ctx, arrivals out of order, half an objective) exits with status 2 and a clear
message, not a traceback.

Issue 44's additions: graph mode's static decode step (attention over the whole cache, the mask
built from the lengths), run without capture, gives the eager loop's tokens and the
reference's (max batch 1, 3, 4, 16, stale values in the cache) and attends over the whole cache
at every step; on CUDA, captured, the eager loop's tokens (skipped without CUDA); `--mode graphs`
refused on the CPU, served there with the hidden `--uncaptured`; teacher forcing against
float64: the served tokens agree, a planted token (the one the independent float64 forward
ranks last) is found unexplained with that forward's gap, is a near-tie under a larger gap, and
of two planted in one request only the first is unexplained; `--dtype f16`: weights, cache and
logits in float16 (half the bytes; logits near float64's, not f32's), its tokens teacher-forced
with none unexplained; and the new refusals (an unknown dtype, mode or --cudnn-sdpa value,
--uncaptured without graphs, --side or --near-tie without --teacher-force, a negative gap, no
--stream, a missing or failed side, a token outside the vocabulary), exit 2.
"""

import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "serve_gpt.py")
sys.path.insert(0, HERE)
import serve_gpt  # noqa: E402

CONFIG = {"n_layer": 2, "n_embd": 64, "n_head": 4, "n_ctx": 128, "vocab_size": 256}
SAFETENSORS_NAMES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}


def tiny_tensors(config=CONFIG, seed=0):
    g = torch.Generator().manual_seed(seed)
    e, v, n = config["n_embd"], config["vocab_size"], config["n_ctx"]
    normal = lambda *shape: torch.randn(shape, generator=g) * 0.02
    t = {"wte.weight": normal(v, e), "wpe.weight": normal(n, e)}
    for i in range(config["n_layer"]):
        h = f"h.{i}."
        t[h + "ln_1.weight"], t[h + "ln_1.bias"] = torch.ones(e), torch.zeros(e)
        t[h + "attn.c_attn.weight"] = normal(e, 3 * e)
        t[h + "attn.c_attn.bias"] = torch.zeros(3 * e)
        t[h + "attn.c_proj.weight"], t[h + "attn.c_proj.bias"] = normal(e, e), torch.zeros(e)
        t[h + "ln_2.weight"], t[h + "ln_2.bias"] = torch.ones(e), torch.zeros(e)
        t[h + "mlp.c_fc.weight"], t[h + "mlp.c_fc.bias"] = normal(e, 4 * e), torch.zeros(4 * e)
        t[h + "mlp.c_proj.weight"], t[h + "mlp.c_proj.bias"] = normal(4 * e, e), torch.zeros(e)
    t["ln_f.weight"], t["ln_f.bias"] = torch.ones(e), torch.zeros(e)
    return t


def write_safetensors(path, tensors, metadata, dtype=torch.float32, prefix=""):
    header, chunks, offset = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    for name, tensor in tensors.items():
        raw = bytes(tensor.to(dtype).contiguous().view(-1).view(torch.uint8).tolist())
        header[prefix + name] = {
            "dtype": SAFETENSORS_NAMES[dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))


def tiny_stream(path, count=14, max_batch=4, seed=3):
    rng = random.Random(seed)
    requests = []
    for i in range(count):
        prompt_len = rng.randint(1, 60)
        # Some requests of one token, and lengths that end in different steps.
        n = 1 if i % 5 == 2 else rng.randint(2, 40)
        prompt = [rng.randrange(CONFIG["vocab_size"]) for _ in range(prompt_len)]
        requests.append({"prompt": prompt, "max_new_tokens": n})
    with open(path, "w") as f:
        json.dump({"stream": {"requests": requests}, "max_batch": max_batch}, f)
    return requests


def run_script(*args):
    return subprocess.run(
        [sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=600
    )


def expect_refused(result, *words):
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    for word in words:
        assert word in result.stderr, (word, result.stderr)


def test_tokens_match_reference(weights, stream_path, requests):
    cpu = torch.device("cpu")
    config, w = serve_gpt.load_model(weights, cpu)
    assert config == CONFIG, config
    model = serve_gpt.Gpt2(config, w)
    for max_batch in (1, 3, 4, 16):
        reqs, _, arrivals, slo = serve_gpt.read_stream(stream_path, config, max_batch)
        assert arrivals == [0.0] * len(reqs) and slo is None
        server = serve_gpt.Server(model, reqs, max_batch, cpu)
        server.warm_up()
        figures, outputs = server.serve()
        for i, ((prompt, n), out) in enumerate(zip(reqs, outputs)):
            assert len(out) == n, (i, len(out), n)
            reference = serve_gpt.greedy_reference(model, prompt, n, cpu)
            assert out == reference, f"max_batch {max_batch} request {i}: {out} != {reference}"
        assert figures["in_flight_max"] <= max_batch
        assert figures["generated_tokens"] == sum(n for _, n in reqs)
        if max_batch == 4:
            assert figures["in_flight_max"] == 4, figures
    count = len(requests)
    print(f"ok: tokens equal the no-cache reference for {count} requests at batches 1,3,4,16")


def independent_logits(tensors, config, tokens):
    """GPT-2's last-position logits in float64, written from the definition, sharing no code with
    serve_gpt.py: layer norms, one head at a time, an explicit causal softmax, GELU's formula."""
    t = {k: v.double() for k, v in tensors.items()}
    e, nh = config["n_embd"], config["n_head"]
    hd = e // nh
    p = len(tokens)

    def ln(x, name):
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + 1e-5) * t[name + ".weight"] + t[name + ".bias"]

    def conv1d(x, name):
        return x @ t[name + ".weight"] + t[name + ".bias"]

    x = t["wte.weight"][tokens] + t["wpe.weight"][:p]
    causal = torch.tril(torch.ones(p, p, dtype=torch.bool))
    for i in range(config["n_layer"]):
        qkv = conv1d(ln(x, f"h.{i}.ln_1"), f"h.{i}.attn.c_attn")
        heads = []
        for h in range(nh):
            q = qkv[:, h * hd:(h + 1) * hd]
            k = qkv[:, e + h * hd:e + (h + 1) * hd]
            v = qkv[:, 2 * e + h * hd:2 * e + (h + 1) * hd]
            scores = (q @ k.t()) / hd ** 0.5
            scores = scores.masked_fill(~causal, float("-inf"))
            weights = torch.exp(scores - scores.max(-1, keepdim=True).values)
            heads.append((weights / weights.sum(-1, keepdim=True)) @ v)
        x = x + conv1d(torch.cat(heads, dim=1), f"h.{i}.attn.c_proj")
        m = conv1d(ln(x, f"h.{i}.ln_2"), f"h.{i}.mlp.c_fc")
        m = 0.5 * m * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (m + 0.044715 * m ** 3)))
        x = x + conv1d(m, f"h.{i}.mlp.c_proj")
    return ln(x, "ln_f")[-1] @ t["wte.weight"].t()


def test_model_definition(weights):
    """serve_gpt's forward against the independent one, on weights sharp enough (std 0.2, layer
    norms and biases random) that attention is far from uniform."""
    g = torch.Generator().manual_seed(5)
    tensors = {
        k: torch.randn(v.shape, generator=g) * 0.2 + (1 if "ln" in k and "weight" in k else 0)
        for k, v in tiny_tensors().items()
    }
    path = weights + ".sharp"
    write_safetensors(path, tensors, CONFIG)
    config, w = serve_gpt.load_model(path, torch.device("cpu"))
    model = serve_gpt.Gpt2(config, w)
    worst = 0.0
    rng = random.Random(2)
    for p in (1, 2, 17, 128):
        tokens = [rng.randrange(256) for _ in range(p)]
        with torch.inference_mode():
            ours = model.full(torch.tensor(tokens)).double()
        reference = independent_logits(tensors, config, tokens)
        scale = reference.abs().max().item()
        diff = (ours - reference).abs().max().item() / scale
        worst = max(worst, diff)
        assert diff < 1e-5, (p, diff)
    os.remove(path)
    print(f"ok: the forward equals an independent float64 one (max relative diff {worst:.1e})")


def test_decode_logits(weights):
    """The decode step's logits row by row against full forwards, across slot moves."""
    cpu = torch.device("cpu")
    config, w = serve_gpt.load_model(weights, cpu)
    model = serve_gpt.Gpt2(config, w)
    rng = random.Random(11)
    prompts = [[rng.randrange(256) for _ in range(n)] for n in (5, 37, 1, 20)]
    requests = [(p, 30) for p in prompts]
    server = serve_gpt.Server(model, requests, 4, cpu)
    # Stale, large values in the cache: a mask or length bug would read them.
    server.cache.normal_(0, 10)
    sequences = []
    with torch.inference_mode():
        for slot, p in enumerate(prompts):
            logits = model.full(torch.tensor(p), server.cache, slot)
            sequences.append(p + [int(torch.argmax(logits))])
        worst = 0.0
        for step in range(8):
            if step == 4:
                # Retire slot 1: the last slot's sequence moves into it.
                server._move(1, 3, len(sequences[3]) - 1)
                sequences[1] = sequences.pop()
            b = len(sequences)
            inputs = torch.tensor([s[-1] for s in sequences])
            lengths = torch.tensor([len(s) - 1 for s in sequences])
            span = min(serve_gpt.align(max(len(s) for s in sequences)), server.span_max)
            logits = model.decode_step(inputs, lengths, span, server.cache)
            for i in range(b):
                reference = model.full(torch.tensor(sequences[i]))
                diff = (logits[i] - reference).abs().max().item()
                worst = max(worst, diff)
                assert diff < 1e-5, (step, i, diff)
                sequences[i].append(int(torch.argmax(logits[i])))
    print(f"ok: decode-step logits equal full forwards (max |diff| {worst:.2e}), "
          "across a slot move")


def test_end_to_end(tmp, weights, stream_path, requests):
    cpu = torch.device("cpu")
    config, w = serve_gpt.load_model(weights, cpu)
    model = serve_gpt.Gpt2(config, w)
    reference = [
        serve_gpt.greedy_reference(model, r["prompt"], r["max_new_tokens"], cpu) for r in requests
    ]
    same = [{"prompt": r["prompt"], "output": o} for r, o in zip(requests, reference)]
    altered = json.loads(json.dumps(same))
    # Request 3, token 2 differs in "contiguous" (request 3 has at least 3 tokens).
    assert len(altered[3]["output"]) >= 3
    altered[3]["output"][2] = (altered[3]["output"][2] + 1) % 256
    ours = os.path.join(tmp, "ours.json")
    with open(ours, "w") as f:
        json.dump({"sides": {"paged": {"requests": same}, "contiguous": {"requests": altered}}}, f)
    out = os.path.join(tmp, "torch.json")
    result = run_script(
        "--weights", weights, "--stream", stream_path, "--device", "cpu", "--json", out,
        "--check", ours,
    )
    assert result.returncode == 0, result.stderr
    with open(out) as f:
        document = json.load(f)
    side = document["side"]
    for key in [
        "generated_tokens_per_s", "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p99",
        "in_flight_mean", "in_flight_max", "peak_allocated_bytes", "peak_reserved_bytes",
        "kv_reserved_bytes_peak", "kv_used_bytes_peak", "weights_bytes", "wall_s", "requests",
    ]:
        assert key in side, key
    assert document["tf32"] is False and document["model"] == CONFIG
    assert document["max_batch"] == 4
    assert document["dtype"] == "f32" and document["mode"] == "eager", document
    assert document["cudnn_sdpa"] is False
    assert "graphs" not in document and "teacher_forcing" not in document
    assert side["decode_step_ms_mean"] > 0 and side["decode_steps"] > 0
    assert [r["output"] for r in side["requests"]] == reference
    assert side["ttft_ms_p50"] <= side["ttft_ms_p99"] and side["tpot_ms_p50"] <= side["tpot_ms_p99"]
    assert 0 < side["kv_used_bytes_peak"] <= side["kv_reserved_bytes_peak"]
    tokens = sum(len(o) for o in reference)
    paged, contiguous = document["agreement"]["paged"], document["agreement"]["contiguous"]
    assert paged == {
        "requests": len(requests), "identical": len(requests), "tokens": tokens,
        "tokens_equal": tokens, "first_mismatch": None,
    }, paged
    assert contiguous["identical"] == len(requests) - 1
    assert contiguous["tokens_equal"] == tokens - 1
    mismatch = contiguous["first_mismatch"]
    assert (mismatch["request"], mismatch["index"]) == (3, 2), mismatch
    assert mismatch["torch"] == reference[3][2] and mismatch["ours"] == altered[3]["output"][2]
    assert mismatch["torch_top2_gap"] > 0
    assert "agreement:" in result.stdout
    # --max-batch overrides the stream's.
    result = run_script("--weights", weights, "--stream", stream_path, "--device", "cpu",
                        "--max-batch", "2", "--json", out)
    assert result.returncode == 0, result.stderr
    with open(out) as f:
        document = json.load(f)
    assert document["max_batch"] == 2 and document["side"]["in_flight_max"] == 2
    assert [r["output"] for r in document["side"]["requests"]] == reference
    print("ok: end to end, --json and --check (identical and altered sides), --max-batch")
    return reference


def test_goodput_count():
    slo = {"ttft_s": 0.5, "tpot_s": 0.01}
    ttft = [0.1, 0.5, 0.6, 0.2, 0.3]
    tpot = [0.01, 0.005, 0.001, 0.02, None]
    # Requests 0, 1 (both at the limits) and 4 (no TPOT) meet it; 2 is late, 3 too slow.
    assert serve_gpt.goodput(slo, ttft, tpot, 2.0) == (3, 1.5)
    assert serve_gpt.goodput(None, ttft, tpot, 2.0) == (None, None)
    assert serve_gpt.objective(None, None, None) is None
    assert serve_gpt.objective({"ttft_s": 1.0, "tpot_s": 0.1}, None, 20) == {
        "ttft_s": 1.0, "tpot_s": 0.02,
    }
    print("ok: goodput counts the requests within both limits (a one-token request: TTFT only)")


def test_arrivals(tmp, weights, requests, reference):
    """The stream with arrivals spread over ~0.4 s: the same tokens; every request's first token
    after its arrival; goodput against the stream's slo and the flags'."""
    rng = random.Random(7)
    timed, t = [], 0.0
    for r in requests:
        t += rng.expovariate(40.0)
        timed.append(dict(r, arrival_s=round(t, 4)))
    last = timed[-1]["arrival_s"]
    path = os.path.join(tmp, "timed.json")
    with open(path, "w") as f:
        json.dump({"stream": {"requests": timed}, "max_batch": 4,
                   "slo": {"ttft_s": 60.0, "tpot_s": 60.0}}, f)
    cpu = torch.device("cpu")
    config, w = serve_gpt.load_model(weights, cpu)
    model = serve_gpt.Gpt2(config, w)
    reqs, max_batch, arrivals, slo = serve_gpt.read_stream(path, config, None)
    assert arrivals == [r["arrival_s"] for r in timed] and slo == {"ttft_s": 60.0, "tpot_s": 60.0}
    server = serve_gpt.Server(model, reqs, max_batch, cpu, arrivals, slo)
    server.warm_up()
    # Record when each prefill starts, relative to the loop's start.
    starts, full = [], model.full
    def spy(tokens, cache=None, slot=0):
        starts.append((tokens.tolist(), time.perf_counter()))
        return full(tokens, cache, slot)
    model.full = spy
    began = time.perf_counter()
    figures, outputs = server.serve()
    model.full = full
    assert outputs == reference
    # Each prompt is prefilled no earlier than its arrival (the loop's t0 is after `began`).
    for (prompt, _), arrival in zip(reqs, arrivals):
        at = next(t for p, t in starts if p == prompt)
        assert at - began >= arrival - 1e-6, (arrival, at - began)
    assert figures["wall_s"] >= last
    assert figures["goodput_requests"] == len(reqs)
    assert abs(figures["goodput_rps"] - len(reqs) / figures["wall_s"]) < 1e-9
    # TTFT from arrival: below the time from t0 to the last first token.
    assert figures["ttft_ms_p99"] < figures["wall_s"] * 1e3
    out = os.path.join(tmp, "timed_out.json")
    result = run_script("--weights", weights, "--stream", path, "--device", "cpu", "--json", out,
                        "--slo-ttft-ms", "0.000001")
    assert result.returncode == 0, result.stderr
    with open(out) as f:
        document = json.load(f)
    assert document["arrivals"] is True
    assert abs(document["slo"]["ttft_s"] - 1e-9) < 1e-18 and document["slo"]["tpot_s"] == 60.0
    assert document["side"]["goodput_requests"] == 0 and document["side"]["goodput_rps"] == 0
    assert [r["output"] for r in document["side"]["requests"]] == reference
    assert "goodput 0.00 requests/s" in result.stdout, result.stdout
    print(f"ok: arrivals over {last:.2f} s replayed: same tokens, no prefill before its arrival, "
          "goodput from the stream's slo and from the flags")


def test_formats(tmp, stream_path, reference):
    tensors = tiny_tensors()
    prefixed = os.path.join(tmp, "prefixed.safetensors")
    write_safetensors(prefixed, tensors, CONFIG, prefix="transformer.")
    result = run_script("--weights", prefixed, "--stream", stream_path, "--device", "cpu",
                        "--json", os.path.join(tmp, "p.json"))
    assert result.returncode == 0, result.stderr
    with open(os.path.join(tmp, "p.json")) as f:
        assert [r["output"] for r in json.load(f)["side"]["requests"]] == reference
    for dtype in (torch.float16, torch.bfloat16):
        path = os.path.join(tmp, f"{SAFETENSORS_NAMES[dtype]}.safetensors")
        write_safetensors(path, tensors, CONFIG, dtype=dtype)
        _, w = serve_gpt.load_model(path, torch.device("cpu"))
        expected = tensors["h.1.mlp.c_fc.weight"].to(dtype).float()
        assert torch.equal(w["layers"][1]["c_fc"][0], expected), dtype
    print("ok: the transformer. prefix gives the same tokens; F16 and BF16 read exactly")


def test_graph_decoder(weights, stream_path, requests):
    """Graph mode's static decode step (attention over the whole cache, the mask from the
    lengths inside the step), run without capture: the eager loop's tokens and the no-cache
    reference's, at max batch 1, 3, 4 and 16, with stale large values in every cache position
    beyond the sequences' lengths; on CUDA, captured as well."""
    cpu = torch.device("cpu")
    config, w = serve_gpt.load_model(weights, cpu)
    model = serve_gpt.Gpt2(config, w)
    reference = [
        serve_gpt.greedy_reference(model, r["prompt"], r["max_new_tokens"], cpu) for r in requests
    ]
    for max_batch in (1, 3, 4, 16):
        reqs, _, _, _ = serve_gpt.read_stream(stream_path, config, max_batch)
        outputs = {}
        for mode in serve_gpt.MODES:
            server = serve_gpt.Server(model, reqs, max_batch, cpu, mode=mode, capture=False)
            server.warm_up()
            assert (server.decoder is None) == (mode == "eager")
            torch.manual_seed(max_batch)
            server.cache.normal_(0, 10)
            calls, decode_step = [], model.decode_step
            # Which spans the loop's steps attend over: graphs always the cache's whole length.
            model.decode_step = lambda *a: calls.append(a[2]) or decode_step(*a)
            figures, outputs[mode] = server.serve()
            model.decode_step = decode_step
            assert len(calls) == figures["decode_steps"] > 0 and figures["decode_step_ms_mean"] > 0
            if mode == "graphs":
                assert set(calls) == {server.span_max}, set(calls)
        assert outputs["graphs"] == outputs["eager"], max_batch
        assert outputs["graphs"] == reference, max_batch
    # The decoder's own step: one graph's worth (b of max_batch slots) against decode_step.
    server = serve_gpt.Server(model, [(r["prompt"], r["max_new_tokens"]) for r in requests], 4,
                              cpu, mode="graphs", capture=False)
    server.cache.normal_(0, 10)
    prompts = [r["prompt"] for r in requests if len(r["prompt"]) >= 2][:3]
    with torch.inference_mode():
        for slot, p in enumerate(prompts):
            model.full(torch.tensor(p[:-1]), server.cache, slot)
        tokens, lengths = [p[-1] for p in prompts], [len(p) - 1 for p in prompts]
        # decode_step writes the step's keys at `lengths`: the same writes, so a copy first.
        saved = server.cache.clone()
        chosen = server.decoder.step(tokens, lengths)
        decoded = server.cache.clone()
        server.cache.copy_(saved)
        span = serve_gpt.align(max(lengths) + 1)
        logits = model.decode_step(torch.tensor(tokens), torch.tensor(lengths), span, server.cache)
    assert chosen == torch.argmax(logits, dim=-1).tolist()
    assert torch.equal(decoded, server.cache), "the static step's cache writes differ"
    assert server.decoder.inputs[:3].tolist() == [list(x) for x in zip(tokens, lengths)]
    print("ok: graph mode's static decode step (uncaptured) gives the eager loop's tokens and the "
          "reference's at batches 1,3,4,16, stale cache values masked")
    if not torch.cuda.is_available():
        print("skipped: graph capture (no CUDA)")
        return
    cuda = torch.device("cuda")
    _, w = serve_gpt.load_model(weights, cuda)
    model = serve_gpt.Gpt2(config, w)
    reqs, _, _, _ = serve_gpt.read_stream(stream_path, config, 4)
    outputs = {}
    for mode in serve_gpt.MODES:
        server = serve_gpt.Server(model, reqs, 4, cuda, mode=mode)
        server.warm_up()
        if mode == "graphs":
            assert sorted(server.decoder.graphs) == [1, 2, 3, 4]
        _, outputs[mode] = server.serve()
    assert outputs["graphs"] == outputs["eager"]
    print("ok: on CUDA, the captured graphs give the eager loop's tokens")


def plant(tensors, prompt, output, index):
    """The output with token `index` replaced by the one the independent float64 forward ranks
    last after prompt + output[:index], and the gap (its top-1 logit - that token's)."""
    logits = independent_logits(tensors, CONFIG, prompt + output[:index])
    worst = int(torch.argmin(logits))
    planted = list(output)
    planted[index] = worst
    return planted, (logits.max() - logits[worst]).item()


def test_teacher_forcing(tmp, weights, requests, reference):
    """Our tokens teacher-forced against float64: the served tokens agree; a token planted at the
    end of one request (the one the float64 forward ranks last) is found, unexplained, its gap
    the independent forward's; with a gap above it, a near-tie; two planted in one request count
    one unexplained (the first), the later one apart; the JSON alone (no --stream)."""
    tensors = tiny_tensors()
    cpu = torch.device("cpu")
    config, w = serve_gpt.load_model(weights, cpu, torch.float64)
    assert all(t.dtype == torch.float64 for t in (w["wte"], w["layers"][1]["c_fc"][0]))
    f64 = serve_gpt.Gpt2(config, w)
    pairs = [(r["prompt"], o) for r, o in zip(requests, reference)]
    clean = serve_gpt.teacher_force(f64, pairs, cpu)
    tokens = sum(len(o) for o in reference)
    assert clean["requests"] == len(requests) and clean["tokens"] == tokens, clean
    assert clean["unexplained"] == 0 and clean["equal_until_near_tie"] == len(requests), clean
    assert clean["disagreements"] == clean["near_ties"] == tokens - clean["equal"], clean

    r = next(i for i, o in enumerate(reference) if len(o) >= 5)
    last = len(reference[r]) - 1
    planted, gap = plant(tensors, requests[r]["prompt"], reference[r], last)
    assert gap > serve_gpt.NEAR_TIE, gap
    outputs = [list(o) for o in reference]
    outputs[r] = planted
    ours = os.path.join(tmp, "planted.json")
    with open(ours, "w") as f:
        json.dump({"sides": {"paged": {"requests": [
            {"prompt": q["prompt"], "output": o} for q, o in zip(requests, outputs)
        ]}}}, f)
    out = os.path.join(tmp, "forced.json")
    result = run_script("--weights", weights, "--teacher-force", ours, "--device", "cpu",
                        "--json", out)
    assert result.returncode == 0, result.stderr
    with open(out) as f:
        document = json.load(f)
    forced = document["teacher_forcing"]["ours"]
    assert document["teacher_forcing"]["reference"] == "float64"
    assert forced["side"] == "paged" and forced["near_tie_gap"] == serve_gpt.NEAR_TIE
    assert forced["unexplained"] == 1, forced
    assert forced["equal_until_near_tie"] == len(requests) - 1, forced
    assert forced["first_divergence"][r] == last, forced["first_divergence"]
    assert abs(forced["first_divergence_gap"][r] - gap) < 1e-9, (forced, gap)
    assert forced["equal"] == clean["equal"] - 1 and forced["tokens"] == tokens, forced
    others = [i for i, j in enumerate(forced["first_divergence"]) if j is not None and i != r]
    assert all(forced["first_divergence_gap"][i] <= serve_gpt.NEAR_TIE for i in others)
    assert "1 unexplained" in result.stdout, result.stdout
    # A gap above the planted one's: a near-tie, nothing unexplained.
    result = run_script("--weights", weights, "--teacher-force", ours, "--device", "cpu",
                        "--near-tie", str(gap * 2), "--json", out)
    assert result.returncode == 0, result.stderr
    with open(out) as f:
        forced = json.load(f)["teacher_forcing"]["ours"]
    assert forced["unexplained"] == 0 and forced["near_ties"] == clean["near_ties"] + 1, forced
    assert forced["near_tie_gap"] == gap * 2 and forced["first_divergence"][r] == last
    # Two planted in one request: one unexplained (the first); the second counted after it.
    twice, _ = plant(tensors, requests[r]["prompt"], reference[r], 1)
    twice, _ = plant(tensors, requests[r]["prompt"], twice, 3)
    two = serve_gpt.teacher_force(f64, [(requests[r]["prompt"], twice)], cpu)
    assert two["unexplained"] == 1 and two["first_divergence"] == [1], two
    assert two["beyond_gap_after_first"] >= 1 and two["equal_until_near_tie"] == 0, two
    assert two["disagreements"] == two["near_ties"] + 1 + two["beyond_gap_after_first"], two
    print(f"ok: teacher forcing against float64: the served tokens agree ({clean['equal']}/"
          f"{tokens}); a planted token found (gap {gap:.3f}, unexplained 1), a near-tie under a "
          "larger gap, only a request's first disagreement unexplained")
    return ours, r, last


def test_f16(tmp, weights, stream_path, requests, reference, planted):
    """--dtype f16: the weights, the cache and the logits in float16 (half the bytes of f32),
    its logits near the float64 forward's but not equal to f32's, its tokens teacher-forced
    with no unexplained disagreement, our planted token still found in the same run."""
    cpu = torch.device("cpu")
    tensors = tiny_tensors()
    config, w = serve_gpt.load_model(weights, cpu, torch.float16)
    model = serve_gpt.Gpt2(config, w)
    assert model.dtype == torch.float16 and w["layers"][0]["c_attn"][0].dtype == torch.float16
    _, w32 = serve_gpt.load_model(weights, cpu)
    model32 = serve_gpt.Gpt2(config, w32)
    rng = random.Random(8)
    worst = 0.0
    for p in (1, 30, 100):
        tokens = [rng.randrange(256) for _ in range(p)]
        with torch.inference_mode():
            half = model.full(torch.tensor(tokens))
            single = model32.full(torch.tensor(tokens))
        assert half.dtype == torch.float16
        exact = independent_logits(tensors, config, tokens)
        diff = (half.double() - exact).abs().max().item() / exact.abs().max().item()
        worst = max(worst, diff)
        assert diff < 2e-2, (p, diff)
        assert not torch.equal(half.float(), single), "f16 logits equal to f32's: not f16"
    reqs, _, _, _ = serve_gpt.read_stream(stream_path, config, 4)
    server = serve_gpt.Server(model, reqs, 4, cpu)
    assert server.cache.dtype == torch.float16
    ours, r, last = planted
    out = os.path.join(tmp, "f16.json")
    result = run_script("--weights", weights, "--stream", stream_path, "--device", "cpu",
                        "--dtype", "f16", "--json", out, "--check", ours, "--teacher-force", ours)
    assert result.returncode == 0, result.stderr
    assert "f16, TF32 off" in result.stdout, result.stdout
    with open(out) as f:
        document = json.load(f)
    side = document["side"]
    assert document["dtype"] == "f16" and document["mode"] == "eager"
    s = server.span_max
    assert side["kv_reserved_bytes_peak"] == 2 * 2 * 4 * 4 * s * 16 * 2, side
    assert side["weights_bytes"] * 2 == serve_gpt.weights_bytes(w32)
    outputs = [q["output"] for q in side["requests"]]
    assert [len(o) for o in outputs] == [q["max_new_tokens"] for q in requests]
    equal = sum(a == b for o, ref in zip(outputs, reference) for a, b in zip(o, ref))
    total = sum(len(o) for o in reference)
    assert equal >= 0.8 * total, (equal, total)
    forcing = document["teacher_forcing"]
    own = forcing["torch"]
    assert own["dtype"] == "f16" and own["mode"] == "eager" and own["tokens"] == total
    assert own["unexplained"] == 0, own
    assert forcing["ours"]["unexplained"] == 1 and forcing["ours"]["first_divergence"][r] == last
    assert document["agreement"]["paged"]["tokens"] == total
    print(f"ok: --dtype f16: weights, cache and logits in float16 (max relative diff to float64 "
          f"{worst:.1e}), {equal}/{total} tokens equal to f32's, teacher-forced with "
          f"{own['near_ties']} near-ties and none unexplained")


def test_graphs_end_to_end(tmp, weights, stream_path, reference):
    """--mode graphs through the command line: refused on the CPU; with the hidden --uncaptured
    its static step serves the stream with the reference's tokens and says so in the JSON."""
    expect_refused(run_script("--weights", weights, "--stream", stream_path, "--device", "cpu",
                              "--mode", "graphs"), "--mode graphs", "CUDA")
    out = os.path.join(tmp, "graphs.json")
    result = run_script("--weights", weights, "--stream", stream_path, "--device", "cpu",
                        "--mode", "graphs", "--uncaptured", "--json", out)
    assert result.returncode == 0, result.stderr
    with open(out) as f:
        document = json.load(f)
    assert document["mode"] == "graphs" and document["dtype"] == "f32"
    assert document["graphs"]["captured"] is False and document["graphs"]["batch_sizes"] == []
    assert [q["output"] for q in document["side"]["requests"]] == reference
    assert "decode step" in result.stdout, result.stdout
    print("ok: --mode graphs refused on the CPU (exit 2); uncaptured, the reference's tokens")


def test_new_refusals(tmp, weights, stream_path, planted):
    ours, _, _ = planted
    base = ["--weights", weights, "--stream", stream_path, "--device", "cpu"]
    expect_refused(run_script(*base, "--dtype", "f64"), "--dtype", "f64")
    expect_refused(run_script(*base, "--dtype", "bf16"), "--dtype")
    expect_refused(run_script(*base, "--mode", "compiled"), "--mode")
    expect_refused(run_script(*base, "--cudnn-sdpa", "maybe"), "--cudnn-sdpa")
    expect_refused(run_script(*base, "--uncaptured"), "--uncaptured", "--mode graphs")
    expect_refused(run_script(*base, "--side", "paged"), "--teacher-force")
    expect_refused(run_script(*base, "--teacher-force", ours, "--near-tie", "-1"), "--near-tie")
    expect_refused(run_script("--weights", weights, "--device", "cpu"), "--stream")
    expect_refused(run_script("--weights", weights, "--device", "cpu", "--teacher-force", ours,
                              "--side", "naive"), "no sides.naive", "paged")
    with open(ours) as f:
        document = json.load(f)
    document["sides"]["contiguous"] = {"error": "refused under the budget"}
    failed = os.path.join(tmp, "failed_side.json")
    with open(failed, "w") as f:
        json.dump(document, f)
    expect_refused(run_script("--weights", weights, "--device", "cpu", "--teacher-force", failed,
                              "--side", "contiguous"), "sides.contiguous", "no result")
    del document["sides"]["contiguous"]
    document["sides"]["paged"]["requests"][0]["output"][0] = 256
    bad = os.path.join(tmp, "bad_ours.json")
    with open(bad, "w") as f:
        json.dump(document, f)
    expect_refused(run_script("--weights", weights, "--device", "cpu", "--teacher-force", bad),
                   "256", "vocabulary")
    # Refused before serving: the stream is valid, the JSON to teacher-force is not.
    expect_refused(run_script(*base, "--teacher-force", bad), "vocabulary")
    print("ok: an unknown dtype or mode, --uncaptured without graphs, --side or --near-tie "
          "without --teacher-force, a negative gap, no --stream, a missing or failed side, a "
          "token outside the vocabulary: exit 2 with a message")


def test_refusals(tmp, weights, stream_path):
    with open(weights, "rb") as f:
        data = f.read()
    cut = os.path.join(tmp, "cut.safetensors")
    with open(cut, "wb") as f:
        f.write(data[:-100])
    expect_refused(run_script("--weights", cut, "--stream", stream_path, "--device", "cpu"),
                   "truncated", "ln_f.bias")
    with open(cut, "wb") as f:
        f.write(data[:40])
    expect_refused(run_script("--weights", cut, "--stream", stream_path, "--device", "cpu"),
                   "truncated", "header")
    with open(cut, "wb") as f:
        f.write(data[:5])
    expect_refused(run_script("--weights", cut, "--stream", stream_path, "--device", "cpu"),
                   "truncated")

    tensors = tiny_tensors()
    del tensors["h.1.mlp.c_proj.bias"]
    missing = os.path.join(tmp, "missing.safetensors")
    write_safetensors(missing, tensors, CONFIG)
    expect_refused(run_script("--weights", missing, "--stream", stream_path, "--device", "cpu"),
                   "missing tensor h.1.mlp.c_proj.bias")

    tensors = tiny_tensors()
    tensors["h.0.attn.c_attn.weight"] = tensors["h.0.attn.c_attn.weight"].t().contiguous()
    wrong = os.path.join(tmp, "wrong.safetensors")
    write_safetensors(wrong, tensors, CONFIG)
    expect_refused(run_script("--weights", wrong, "--stream", stream_path, "--device", "cpu"),
                   "h.0.attn.c_attn.weight", "[192, 64]", "[64, 192]")

    nometa = os.path.join(tmp, "nometa.safetensors")
    write_safetensors(nometa, tiny_tensors(), None)
    expect_refused(run_script("--weights", nometa, "--stream", stream_path, "--device", "cpu"),
                   "n_layer")

    long_stream = os.path.join(tmp, "long.json")
    with open(long_stream, "w") as f:
        json.dump({"stream": {"requests": [{"prompt": [1] * 100, "max_new_tokens": 29}]},
                   "max_batch": 2}, f)
    expect_refused(run_script("--weights", weights, "--stream", long_stream, "--device", "cpu"),
                   "exceeds n_ctx 128")
    with open(long_stream, "w") as f:
        json.dump({"stream": {"requests": [{"prompt": [1, 256], "max_new_tokens": 2}]},
                   "max_batch": 2}, f)
    expect_refused(run_script("--weights", weights, "--stream", long_stream, "--device", "cpu"),
                   "256", "vocabulary")
    with open(long_stream, "w") as f:
        json.dump({"stream": {"requests": [{"prompt": [1], "max_new_tokens": 2}]}}, f)
    expect_refused(run_script("--weights", weights, "--stream", long_stream, "--device", "cpu"),
                   "max_batch")
    # At exactly n_ctx it is served.
    with open(long_stream, "w") as f:
        json.dump({"stream": {"requests": [{"prompt": [1] * 100, "max_new_tokens": 28}]},
                   "max_batch": 2}, f)
    result = run_script("--weights", weights, "--stream", long_stream, "--device", "cpu")
    assert result.returncode == 0, result.stderr
    expect_refused(run_script("--weights", os.path.join(tmp, "none"), "--stream", stream_path,
                              "--device", "cpu"), "cannot read")
    with open(long_stream, "w") as f:
        json.dump({"stream": {"requests": [{"prompt": [1], "max_new_tokens": 2, "arrival_s": 0.5},
                                           {"prompt": [2], "max_new_tokens": 2, "arrival_s": 0.2}]},
                   "max_batch": 2}, f)
    expect_refused(run_script("--weights", weights, "--stream", long_stream, "--device", "cpu"),
                   "must not decrease")
    with open(long_stream, "w") as f:
        json.dump({"stream": {"requests": [{"prompt": [1], "max_new_tokens": 2,
                                            "arrival_s": -1}]}, "max_batch": 2}, f)
    expect_refused(run_script("--weights", weights, "--stream", long_stream, "--device", "cpu"),
                   "arrival_s")
    with open(long_stream, "w") as f:
        json.dump({"stream": {"requests": [{"prompt": [1], "max_new_tokens": 2}]},
                   "max_batch": 2}, f)
    expect_refused(run_script("--weights", weights, "--stream", long_stream, "--device", "cpu",
                              "--slo-ttft-ms", "100"), "tpot_s")
    with open(long_stream, "w") as f:
        json.dump({"stream": {"requests": [{"prompt": [1], "max_new_tokens": 2}]},
                   "max_batch": 2, "slo": {"ttft_s": 1}}, f)
    expect_refused(run_script("--weights", weights, "--stream", long_stream, "--device", "cpu"),
                   "tpot")
    print("ok: truncated files, a missing tensor, a wrong shape, no metadata, a prompt too long, "
          "a token outside the vocabulary, no max_batch, arrivals out of order or negative, half "
          "an objective: exit 2 with a message")


def main():
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        weights = os.path.join(tmp, "tiny.safetensors")
        write_safetensors(weights, tiny_tensors(), CONFIG)
        stream_path = os.path.join(tmp, "stream.json")
        requests = tiny_stream(stream_path)
        test_model_definition(weights)
        test_tokens_match_reference(weights, stream_path, requests)
        test_decode_logits(weights)
        reference = test_end_to_end(tmp, weights, stream_path, requests)
        test_goodput_count()
        test_arrivals(tmp, weights, requests, reference)
        test_formats(tmp, stream_path, reference)
        test_refusals(tmp, weights, stream_path)
        test_graph_decoder(weights, stream_path, requests)
        test_graphs_end_to_end(tmp, weights, stream_path, reference)
        planted = test_teacher_forcing(tmp, weights, requests, reference)
        test_f16(tmp, weights, stream_path, requests, reference, planted)
        test_new_refusals(tmp, weights, stream_path, planted)
    print("all passed")


if __name__ == "__main__":
    main()
