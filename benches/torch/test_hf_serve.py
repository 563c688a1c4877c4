"""Tests of hf_serve.py with plain python (no pytest), where torch and transformers are installed:

    python3 benches/torch/test_hf_serve.py [--device cpu|cuda]

The tiny random GPT-2 of test_serve_gpt.py. Checked: the Hugging Face model built from the file
gives serve_gpt.py's logits (tied head; an untied `lm_head.weight` is used when present); the
continuous-batching peer, with arrivals, returns for every request exactly max_new_tokens tokens,
equal to the no-cache greedy reference, each mode's figures in the JSON, goodput against the
stream's objective, `--check` against an identical side; a mode that cannot run (flash attention
on the CPU) is recorded as an error and the next mode serves; `--dtype f16`: the model's
parameters, its logits and the manager's KV cache in float16, the JSON saying so, every request of
exactly max_new_tokens tokens, teacher-forced against serve_gpt.py's float64 forward with no
disagreement beyond a near-tie; bad input (a missing tensor, an unknown mode or dtype) exits with
status 2.
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "hf_serve.py")
sys.path.insert(0, HERE)
import hf_serve  # noqa: E402
import serve_gpt  # noqa: E402
from test_serve_gpt import CONFIG, tiny_tensors, write_safetensors  # noqa: E402


def run_script(*args):
    return subprocess.run(
        [sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=900
    )


def test_logits(tmp, weights, device):
    _, ours = serve_gpt.load_model(weights, device)
    ours = serve_gpt.Gpt2(CONFIG, ours)
    config, model = hf_serve.build_model(weights, device, torch.float32)
    assert config == CONFIG, config
    model.set_attn_implementation("sdpa")
    rng = random.Random(4)
    worst = 0.0
    for p in (1, 9, 100):
        tokens = [rng.randrange(256) for _ in range(p)]
        with torch.inference_mode():
            hf = model(input_ids=torch.tensor([tokens], device=device)).logits[0, -1]
            mine = ours.full(torch.tensor(tokens, device=device))
        diff = (hf - mine).abs().max().item()
        worst = max(worst, diff)
        assert diff < 1e-4, (p, diff)
    # An untied head of its own is used.
    tensors = tiny_tensors()
    tensors["lm_head.weight"] = torch.randn(256, 64) * 0.02
    untied = os.path.join(tmp, "untied.safetensors")
    write_safetensors(untied, tensors, CONFIG)
    _, model = hf_serve.build_model(untied, device, torch.float32)
    assert torch.equal(model.lm_head.weight.cpu(), tensors["lm_head.weight"])
    assert not torch.equal(model.lm_head.weight.cpu(), model.transformer.wte.weight.cpu())
    print(f"ok: the HF model from the file gives serve_gpt's logits (max |diff| {worst:.1e}); "
          "an untied lm_head.weight is used")


def test_serving(tmp, weights, device):
    rng = random.Random(9)
    requests, t = [], 0.0
    for i in range(10):
        t += rng.expovariate(50.0)
        prompt = [rng.randrange(256) for _ in range(rng.randint(2, 50))]
        n = 1 if i == 3 else rng.randint(2, 30)
        requests.append({"prompt": prompt, "max_new_tokens": n, "arrival_s": round(t, 4)})
    stream = os.path.join(tmp, "stream.json")
    with open(stream, "w") as f:
        json.dump({"stream": {"requests": requests}, "max_batch": 4,
                   "slo": {"ttft_s": 60.0, "tpot_s": 60.0}}, f)
    _, w = serve_gpt.load_model(weights, device)
    model = serve_gpt.Gpt2(CONFIG, w)
    reference = [
        serve_gpt.greedy_reference(model, r["prompt"], r["max_new_tokens"], device)
        for r in requests
    ]
    ours = os.path.join(tmp, "ours.json")
    with open(ours, "w") as f:
        json.dump({"sides": {"paged": {"requests": [
            {"prompt": r["prompt"], "output": o} for r, o in zip(requests, reference)
        ]}}}, f)
    out = os.path.join(tmp, "hf.json")
    modes = "paged_sdpa,paged_flash,paged_eager"
    # On the CPU the library would size its cache from the host's memory: small fixed sizes.
    extra = ["--num-blocks", "64", "--block-size", "16", "--max-batch-tokens", "256"]
    result = run_script("--weights", weights, "--stream", stream, "--device", device.type,
                        "--mode", modes, "--json", out, "--check", ours, "--timeout-s", "120",
                        *extra)
    assert result.returncode == 0, (result.stdout, result.stderr)
    with open(out) as f:
        document = json.load(f)
    assert document["modes"] == modes.split(",") and document["arrivals"] is True
    assert document["dtype"] == "f32"
    served = ["paged_sdpa", "paged_eager"]
    if "error" not in document["sides"]["paged_flash"]:
        served.append("paged_flash")  # flash-attn installed and accepting f32: checked as well
    for mode in served:
        side = document["sides"][mode]
        assert "error" not in side, side
        outputs = [r["output"] for r in side["requests"]]
        assert [len(o) for o in outputs] == [r["max_new_tokens"] for r in requests]
        assert side["length_mismatches"] == 0
        assert outputs == reference, (mode, outputs, reference)
        assert side["goodput_requests"] == len(requests)
        assert side["ttft_ms_p50"] <= side["ttft_ms_p99"] < side["wall_s"] * 1e3
        assert side["wall_s"] >= requests[-1]["arrival_s"]
        assert side["ttft_source"] == "token_timestamps", side["ttft_source"]
        assert side["in_flight_max"] is None or 1 <= side["in_flight_max"] <= 4, side
        assert side["cb_config"]["max_requests_per_batch"] == 4
        assert side["cb_config"]["cache_dtype"] == "torch.float32", side["cb_config"]
        a = document["agreement"][mode]["paged"]
        assert a["identical"] == len(requests) and a["first_mismatch"] is None, a
    if device.type == "cpu":
        # Flash attention needs CUDA (and the package): a recorded failure, then paged_eager runs.
        assert "error" in document["sides"]["paged_flash"], document["sides"]["paged_flash"]
    print(f"ok: HF continuous batching with arrivals: exact lengths, the reference's tokens, "
          f"figures and agreement for {', '.join(served)}; paged_flash: "
          f"{document['sides']['paged_flash'].get('error', 'served')[:80]}")
    return stream


def test_f16(tmp, weights, stream, device):
    """--dtype f16: parameters, logits and the KV cache in float16; tokens teacher-forced."""
    config, model = hf_serve.build_model(weights, device, torch.float16)
    assert all(p.dtype == torch.float16 for p in model.parameters())
    _, w = serve_gpt.load_model(weights, device, torch.float16)
    ours = serve_gpt.Gpt2(config, w)
    _, w64 = serve_gpt.load_model(weights, device, torch.float64)
    reference = serve_gpt.Gpt2(config, w64)
    model.set_attn_implementation("sdpa")
    rng = random.Random(6)
    worst = 0.0
    for p in (1, 9, 100):
        tokens = [rng.randrange(256) for _ in range(p)]
        with torch.inference_mode():
            hf = model(input_ids=torch.tensor([tokens], device=device)).logits[0, -1]
            exact = reference.full(torch.tensor(tokens, device=device))
            mine = ours.full(torch.tensor(tokens, device=device))
        assert hf.dtype == torch.float16 and mine.dtype == torch.float16
        diff = (hf.double() - exact).abs().max().item() / exact.abs().max().item()
        worst = max(worst, diff)
        assert diff < 2e-2, (p, diff)
    out = os.path.join(tmp, "hf16.json")
    extra = ["--num-blocks", "64", "--block-size", "16", "--max-batch-tokens", "256"]
    result = run_script("--weights", weights, "--stream", stream, "--device", device.type,
                        "--dtype", "f16", "--mode", "paged_sdpa", "--json", out, "--check",
                        os.path.join(tmp, "ours.json"), "--timeout-s", "120", *extra)
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert "f16, TF32 off" in result.stdout, result.stdout
    with open(out) as f:
        document = json.load(f)
    assert document["dtype"] == "f16"
    side = document["sides"]["paged_sdpa"]
    assert "error" not in side, side
    assert side["cb_config"]["cache_dtype"] == "torch.float16", side["cb_config"]
    assert side["length_mismatches"] == 0
    with open(stream) as f:
        requests = json.load(f)["stream"]["requests"]
    pairs = [(r["prompt"], q["output"]) for r, q in zip(requests, side["requests"])]
    assert [len(o) for _, o in pairs] == [r["max_new_tokens"] for r in requests]
    forced = serve_gpt.teacher_force(reference, pairs, device)
    assert forced["unexplained"] == 0, forced
    print(f"ok: --dtype f16: parameters, logits (max relative diff to float64 {worst:.1e}) and "
          f"the KV cache in float16; {forced['equal']}/{forced['tokens']} tokens the float64 "
          f"argmax, {forced['near_ties']} near-ties, none unexplained")


def test_refusals(tmp, stream):
    tensors = tiny_tensors()
    del tensors["h.0.mlp.c_fc.weight"]
    missing = os.path.join(tmp, "missing.safetensors")
    write_safetensors(missing, tensors, CONFIG)
    result = run_script("--weights", missing, "--stream", stream, "--device", "cpu")
    assert result.returncode == 2 and "missing tensor h.0.mlp.c_fc.weight" in result.stderr, (
        result.stderr
    )
    assert "Traceback" not in result.stderr
    weights = os.path.join(tmp, "tiny.safetensors")
    result = run_script("--weights", weights, "--stream", stream, "--device", "cpu",
                        "--mode", "paged_nothing")
    assert result.returncode == 2 and "--mode" in result.stderr, result.stderr
    result = run_script("--weights", weights, "--stream", stream, "--device", "cpu",
                        "--dtype", "f64")
    assert result.returncode == 2 and "--dtype" in result.stderr, result.stderr
    print("ok: a missing tensor, an unknown mode or dtype: exit 2 with a message")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    device = torch.device(parser.parse_args().device)
    torch.backends.cuda.matmul.allow_tf32 = False
    with tempfile.TemporaryDirectory() as tmp:
        weights = os.path.join(tmp, "tiny.safetensors")
        write_safetensors(weights, tiny_tensors(), CONFIG)
        test_logits(tmp, weights, device)
        stream = test_serving(tmp, weights, device)
        test_f16(tmp, weights, stream, device)
        test_refusals(tmp, stream)
    print("all passed")


if __name__ == "__main__":
    main()
