"""PyTorch's side of `serve_gpt`: the same GPT-2 server, f32 or f16 (TF32 off), continuous batching,
decode steps eager or replayed from CUDA graphs; and our tokens teacher-forced against float64.

    python3 benches/torch/serve_gpt.py --weights gpt2.safetensors --stream ours.json \\
        --json torch_serve_gpt.json --check ours.json [--dtype f32|f16] [--mode eager|graphs] \\
        [--teacher-force ours.json [--side paged] [--near-tie GAP]]
    python3 benches/torch/serve_gpt.py --weights tiny.safetensors --stream ours.json --device cpu
    python3 benches/torch/serve_gpt.py --weights gpt2.safetensors --teacher-force ours.json

`--weights FILE`: GPT-2 in Hugging Face's safetensors layout, read by this script's own parser
(no `safetensors` package needed): names with or without a `transformer.` prefix, Conv1D weights
`[in, out]` (y = x @ W + b), F32, F16 or BF16 (converted to f32), the configuration from the
file's `__metadata__` (`n_layer`, `n_embd`, `n_head`, `n_ctx`, `vocab_size`, decimal strings).
Tensors the model does not use (`lm_head.weight`, `h.N.attn.bias`, ...) are ignored; the LM head
is tied to `wte`. Layer norm eps 1e-5, GELU the tanh approximation, attention scaled by
1/sqrt(head_dim) with the softmax in f32, pre-LN blocks, token t of a sequence at position t.

`--dtype f32|f16` (default f32): the weights (read as f32, then converted), the KV cache and so
every activation in that dtype; f32 with TF32 off (`allow_tf32` false, matmul precision
"highest"). f16 is plain `torch.float16` throughout, with PyTorch's defaults for what happens
inside its kernels (SDPA's softmax in f32; `allow_fp16_reduced_precision_reduction` left as it
is): the logits are f16 as the LM head gives them, and the argmax and `--check` read them so.

SDPA's cuDNN backend is off unless `--cudnn-sdpa on` (`torch.backends.cuda.enable_cudnn_sdp`;
the JSON's "cudnn_sdpa"): PyTorch 2.11 picks it for f16 on an H100, and it builds a plan for
each new shape, 45-60 ms each there (measured on the prefill of every new prompt length and on
the decode step of every new batch size and span), against about 0.1 ms for the flash and
memory-efficient kernels it then uses; a serving loop of varying lengths would pay that all
along. f32 never uses that backend.

`--stream FILE`: a JSON file from `serve_gpt` (the example): `stream.requests` =
[{"prompt": [ids], "max_new_tokens": n, "arrival_s": t}, ...] (a top-level `requests` is accepted
too) and `max_batch` (top level; `--max-batch` overrides it). A request arrives `arrival_s`
seconds after t0 (absent or 0: at t0); arrivals must not decrease along the list. Each generates
exactly `max_new_tokens` tokens greedily (`torch.argmax`: the first index on ties), no EOS;
prompt_len + max_new_tokens must be at most n_ctx. The service objective for goodput is the
stream file's top-level `slo` ({"ttft_s", "tpot_s"}; `ttft_ms`/`tpot_ms` are read too), or
`--slo-ttft-ms` and `--slo-tpot-ms`, which override it; with neither, goodput is not computed.

The loop, as ours: repeat { admit waiting requests that have arrived, first-in first-out, while
fewer than `max_batch` run (admitted ones counted); when none runs and none has arrived, sleep
until the next arrival; prefill each newly admitted request alone (its whole
prompt in one forward, `F.scaled_dot_product_attention(is_causal=True)`), its first token read
to the host at once (a request of one token then leaves; its slot is taken in the next round);
one decode step over every running sequence: one forward of [batch, 1] tokens, each at its own
position, attention (`F.scaled_dot_product_attention`) over the cache sliced to the longest
running length rounded up to a multiple of 16, with an additive mask (0 or -inf) of each
sequence's length, and the batch's next tokens read to the host in one `.tolist()`; sequences
with all their tokens leave } until every request is done.

`--mode eager` (the default) runs that loop as written. `--mode graphs` is the loop as a
speed-minded PyTorch user writes it with CUDA graphs: the same static cache, prefills and
admissions (eager, per request, first token to the host at once), but each decode step is the
replay of a CUDA graph, one captured per batch size b = 1..max_batch during the warm-up (each
after warm-up runs on a side stream, all in one graph memory pool): the graph reads static
input tensors (each running sequence's token and cached length, slots 0..b-1), attends over
the cache's whole length S with the mask built inside the graph from the lengths (so one graph
serves every length; masked positions weigh exactly 0, so the tokens are eager mode's), writes
the new keys and values into the cache and takes the argmax on the device; each step copies the
host's tokens and lengths into the static inputs (one copy), replays graph b and reads the b
tokens to the host (`.tolist()`). Slots are compacted as in eager mode. CUDA graphs need CUDA:
`--mode graphs` on the CPU is refused (exit 2); the graph mode's decode step itself
(`StaticDecoder`, without capture) is what the tests run on the CPU (hidden flag `--uncaptured`).

The KV cache is contiguous per request, as Hugging Face's static cache and FasterTransformer keep
it: one tensor [n_layer, 2 (k, v), max_batch, n_head, S, head_dim], allocated once before the
timed loop, S the longest prompt_len + max_new_tokens - 1 of the stream (the last token generated
is never fed back) rounded up to a multiple of 16, a slot per running request. The running
requests occupy slots 0..B-1, so the decode step reads the cache as a view (no gather): when a
request leaves, the request in the last occupied slot moves into its slot (one copy of its cached
tokens, all layers at once).
`kv_reserved_bytes_peak` is that tensor's size; `kv_used_bytes_peak` the most tokens cached at
once (after a prefill or a decode step's writes) times 2 * n_layer * n_embd * 4 bytes (2 in f16).

Warm-up (untimed, before t0): prefills of the longest prompt's prefixes of 1, 2, 4, ... tokens
and of all of it, the first request's prompt prefilled, then one decode step at each batch size
from 1 to max_batch (copies of that sequence), so that CUDA kernels (loaded lazily) and cuBLAS
are initialised for the shapes served (graphs: the capture of every graph instead); then the
peak memory statistics are reset. `warm_up_s` is its time.

Timed: t0 = the start of the serve loop (after the warm-up and a synchronize); a request's
arrival = t0 + its `arrival_s`; TTFT = the time its first token is on the host - its arrival;
TPOT = (the time of its last token - the time of its first) / (max_new_tokens - 1), requests of
one token left out; p50 and p99 over requests, nearest rank (the sorted value at index
ceil(p/100 * n) - 1); the serving span = the time the last token is on the host - t0;
generated_tokens_per_s = all generated tokens / the span; goodput_rps = the requests whose TTFT
is at most the objective's and whose TPOT (if they have one) is at most its / the span;
in flight = the sequences in each decode step (mean and max over decode steps);
decode_step_ms_mean = the mean host time of a decode step, from building its inputs to its
tokens on the host (synchronous: each step's tokens are read before the next starts).

`--check OURS.json` compares each request's output with `sides.paged.requests[i].output` (and
`sides.contiguous`, `sides.naive` where present) of our JSON and adds `agreement`: {side:
{"requests", "identical", "tokens", "tokens_equal", "first_mismatch"}}, with `first_mismatch` =
{"request", "index", "ours", "torch", "torch_top2_gap"} or null; `torch_top2_gap` is the gap
between PyTorch's two largest logits at that token, computed after the timed loop by a full
forward (no cache) over the prompt and PyTorch's tokens before it (a small gap: a near-tie that
rounding may settle either way).

`--teacher-force OURS.json` (`--side S`: paged by default, or any side of the file, such as a
mode of hf_serve.py's JSON; `--near-tie GAP`, default 1e-2): each request of `sides.S.requests`
(prompt and output) against this model in float64 (the weights read as f32 and widened; on the
run's device), teacher-forced: one full forward (no cache) over the prompt and the output but
its last token, and at each generated position the float64 argmax (first index on ties) against
our token. A disagreement's gap is the float64 top-1 logit minus its logit of our token; within
GAP it is a near-tie. Reported (`teacher_forcing.ours`):
"requests", "tokens", "equal", "equal_rate", "disagreements", "near_ties" (disagreements within
the gap, at every position), "unexplained" (requests whose first disagreement is beyond the
gap: counted only up to each request's first disagreement, since after it the sequence is no
longer the reference's greedy one), "beyond_gap_after_first" (the remaining disagreements:
disagreements = near_ties + unexplained + beyond_gap_after_first), "equal_until_near_tie" (the
requests equal to the float64 argmax up to their first disagreement, that one a near-tie or
none: requests - unexplained) and its "equal_until_near_tie_rate" (the rate the comparison
reports), "first_divergence" and "first_divergence_gap" (per request: the index in its output
of the first disagreement and its gap, or null), "near_tie_gap". With `--stream` the run's own
tokens are teacher-forced too (`teacher_forcing.torch`, with its "dtype" and "mode"), after
the timed loop; without `--stream` nothing is served and the JSON is {"device", "torch",
"model", "teacher_forcing": {"reference": "float64", "near_tie_gap", "ours"}}.

The JSON: {"device", "torch", "tf32": false, "dtype" ("f32" or "f16"), "mode" ("eager" or
"graphs"), "cudnn_sdpa", "model": {"n_layer", "n_embd", "n_head", "n_ctx", "vocab_size"}, "max_batch",
"prefill": "per_request", "arrivals" (whether any request arrives after t0), "slo" ({"ttft_s",
"tpot_s"} or null), "warm_up_s", "side": {"requests_count", "generated_tokens",
"generated_tokens_per_s", "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p99",
"goodput_rps" and "goodput_requests" (null without an objective), "in_flight_mean",
"in_flight_max", "decode_steps", "decode_step_ms_mean", "peak_allocated_bytes",
"peak_reserved_bytes" (torch.cuda.max_memory_*, 0 on the CPU), "kv_reserved_bytes_peak",
"kv_used_bytes_peak" (bytes of the run's dtype), "weights_bytes", "wall_s", "requests":
[{"prompt", "output"}]}, "graphs" (graph mode: {"captured", "batch_sizes", "span"}),
"agreement" (with --check), "teacher_forcing" (with --teacher-force)}. Bad input (a missing or
misshapen tensor, a truncated file, a prompt too long for n_ctx, arrivals out of order, an
unknown dtype or mode, graphs without CUDA, ...) is refused with a message and exit status 2.
"""

import argparse
import json
import math
import os
import struct
import sys
import time

import torch
import torch.nn.functional as F

LN_EPS = 1e-5
# The safetensors dtypes read, and their torch types.
DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
CONFIG_KEYS = ["n_layer", "n_embd", "n_head", "n_ctx", "vocab_size"]
SIDES = ["paged", "contiguous", "naive"]
# `--dtype`: the weights', activations' and KV cache's dtype.
SERVE_DTYPES = {"f32": torch.float32, "f16": torch.float16}
# `--mode`: decode steps run eagerly, or replayed from CUDA graphs (one per batch size).
MODES = ["eager", "graphs"]
# `--near-tie`: a disagreement with the float64 reference whose top-1 logit is at most this much
# above the logit of the token chosen is a near-tie (rounding may settle it either way).
NEAR_TIE = 1e-2
# The cache's length and every span of it that attention reads are multiples of this: the
# memory-efficient SDPA kernel wants its mask's last dimension aligned to 16 (else it pads a copy
# in every layer). The positions past a sequence's length are masked out (-inf: weight exactly 0).
SPAN_ALIGN = 16
# Largest header we accept (the format's own readers cap it at 100 MB too).
MAX_HEADER = 100_000_000


class BadInput(Exception):
    """Input this script refuses: printed as one line, exit status 2."""


# ----------------------------------------------------------------------------- weights


def read_safetensors(path):
    """(metadata, {name: (dtype, shape, start, end)}, load) of a safetensors file, every entry's
    offsets checked against the file's size; load(name) reads one tensor as f32 on the CPU, its
    dtype and byte count checked."""
    try:
        with open(path, "rb") as f:
            data = bytearray(f.read())
    except OSError as error:
        raise BadInput(f"cannot read the weights {path}: {error.strerror}")
    if sys.byteorder != "little":
        raise BadInput("this parser reads little-endian data on little-endian hosts only")
    if len(data) < 8:
        raise BadInput(f"{path}: truncated: {len(data)} bytes, less than the 8-byte header length")
    (header_len,) = struct.unpack("<Q", data[:8])
    if header_len > MAX_HEADER:
        raise BadInput(f"{path}: a header of {header_len} bytes (at most {MAX_HEADER})")
    if 8 + header_len > len(data):
        raise BadInput(
            f"{path}: truncated: the header says {header_len} bytes of JSON "
            f"but only {len(data) - 8} bytes follow the length"
        )
    try:
        header = json.loads(bytes(data[8 : 8 + header_len]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BadInput(f"{path}: the header is not JSON: {error}")
    if not isinstance(header, dict):
        raise BadInput(f"{path}: the header is not a JSON object")
    base = 8 + header_len
    available = len(data) - base
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise BadInput(f"{path}: __metadata__ is not an object")
    tensors = {}
    for name, entry in header.items():
        if not isinstance(entry, dict):
            raise BadInput(f"{path}: tensor {name}: its entry is not an object")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise BadInput(f"{path}: tensor {name}: shape {shape!r} is not a list of sizes")
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(o, int) and o >= 0 for o in offsets)
            and offsets[0] <= offsets[1]
        ):
            raise BadInput(f"{path}: tensor {name}: data_offsets {offsets!r} are not [start, end]")
        start, end = offsets
        if end > available:
            raise BadInput(
                f"{path}: truncated: tensor {name}'s data ends at byte {end} of the data section, "
                f"which has {available} bytes"
            )
        tensors[name] = (dtype, shape, start, end)

    def load(name):
        dtype, shape, start, end = tensors[name]
        if dtype not in DTYPES:
            raise BadInput(f"{path}: tensor {name}: dtype {dtype!r} (F32, F16 or BF16 are read)")
        torch_dtype = DTYPES[dtype]
        size = torch.empty((), dtype=torch_dtype).element_size()
        numel = math.prod(shape)
        if end - start != numel * size:
            raise BadInput(
                f"{path}: tensor {name}: {end - start} bytes of data for shape {shape} of {dtype} "
                f"({numel * size} expected)"
            )
        if numel == 0:
            return torch.zeros(shape, dtype=torch.float32)
        raw = torch.frombuffer(data, dtype=torch.uint8, count=end - start, offset=base + start)
        # A copy first: the data need not be aligned for its dtype in the file.
        return raw.clone().view(torch_dtype).reshape(shape).to(torch.float32)

    return metadata, tensors, load


def load_model(path, device, dtype=torch.float32):
    """The configuration and the weights on `device` in `dtype` (read as f32, then converted),
    every tensor's shape checked."""
    metadata, entries, load = read_safetensors(path)
    config = {}
    for key in CONFIG_KEYS:
        value = metadata.get(key)
        if not (isinstance(value, str) and value.isdigit() and int(value) > 0):
            raise BadInput(
                f"{path}: __metadata__ needs {key} as a positive decimal string, has {value!r}"
            )
        config[key] = int(value)
    e, n_head = config["n_embd"], config["n_head"]
    if e % n_head:
        raise BadInput(f"{path}: n_embd {e} is not a multiple of n_head {n_head}")
    prefix = "transformer." if "transformer.wte.weight" in entries else ""

    def get(name, shape):
        full = prefix + name
        if full not in entries:
            raise BadInput(f"{path}: missing tensor {full}")
        found = entries[full][1]
        if list(found) != list(shape):
            raise BadInput(f"{path}: tensor {full} has shape {found}, expected {list(shape)}")
        return load(full).to(device=device, dtype=dtype)

    vocab, n_ctx = config["vocab_size"], config["n_ctx"]
    weights = {
        "wte": get("wte.weight", [vocab, e]),
        "wpe": get("wpe.weight", [n_ctx, e]),
        "ln_f": (get("ln_f.weight", [e]), get("ln_f.bias", [e])),
        "layers": [],
    }
    for i in range(config["n_layer"]):
        h = f"h.{i}."
        weights["layers"].append(
            {
                "ln_1": (get(h + "ln_1.weight", [e]), get(h + "ln_1.bias", [e])),
                "c_attn": (get(h + "attn.c_attn.weight", [e, 3 * e]),
                           get(h + "attn.c_attn.bias", [3 * e])),
                "attn_proj": (get(h + "attn.c_proj.weight", [e, e]),
                              get(h + "attn.c_proj.bias", [e])),
                "ln_2": (get(h + "ln_2.weight", [e]), get(h + "ln_2.bias", [e])),
                "c_fc": (get(h + "mlp.c_fc.weight", [e, 4 * e]), get(h + "mlp.c_fc.bias", [4 * e])),
                "mlp_proj": (get(h + "mlp.c_proj.weight", [4 * e, e]),
                             get(h + "mlp.c_proj.bias", [e])),
            }
        )
    return config, weights


def weights_bytes(weights):
    tensors = [weights["wte"], weights["wpe"], *weights["ln_f"]]
    for layer in weights["layers"]:
        for pair in layer.values():
            tensors.extend(pair)
    return sum(t.numel() * t.element_size() for t in tensors)


# ----------------------------------------------------------------------------- the model


class Gpt2:
    """GPT-2's forward: a prefill of one sequence, a batched decode step, a no-cache reference."""

    def __init__(self, config, weights):
        self.config = config
        self.w = weights
        self.e = config["n_embd"]
        self.n_head = config["n_head"]
        self.hd = self.e // self.n_head
        # The dtype of the weights, so of the activations, the logits and the KV cache.
        self.dtype = weights["wte"].dtype

    def _ln(self, x, pair):
        return F.layer_norm(x, (self.e,), pair[0], pair[1], LN_EPS)

    def _mlp(self, layer, x):
        h = self._ln(x, layer["ln_2"])
        h = F.gelu(torch.addmm(layer["c_fc"][1], h, layer["c_fc"][0]), approximate="tanh")
        return x + torch.addmm(layer["mlp_proj"][1], h, layer["mlp_proj"][0])

    def _logits(self, x_last):
        """[rows, e] -> [rows, vocab], tied to wte."""
        return self._ln(x_last, self.w["ln_f"]) @ self.w["wte"].t()

    def full(self, tokens, cache=None, slot=0):
        """Logits of the last position of one sequence `tokens` (a device int64 tensor [P]),
        a causal forward over all of it; with `cache`, its keys and values go to slot `slot`."""
        return self._logits(self._hidden(tokens, cache, slot)[-1:])[0]

    def all_logits(self, tokens):
        """Logits [P, vocab] of every position of one sequence `tokens`, no cache: position t's
        row predicts token t + 1 (teacher forcing)."""
        return self._logits(self._hidden(tokens, None, 0))

    def _hidden(self, tokens, cache, slot):
        """The last block's output [P, e] of a causal forward over `tokens` (see `full`)."""
        p = tokens.shape[0]
        e, nh, hd = self.e, self.n_head, self.hd
        positions = torch.arange(p, device=tokens.device)
        x = self.w["wte"][tokens] + self.w["wpe"][positions]
        for index, layer in enumerate(self.w["layers"]):
            h = self._ln(x, layer["ln_1"])
            qkv = torch.addmm(layer["c_attn"][1], h, layer["c_attn"][0])
            # [P, 3e] -> 3 x [1, nh, P, hd]
            q, k, v = qkv.view(p, 3, nh, hd).permute(1, 2, 0, 3).unsqueeze(1).unbind(0)
            if cache is not None:
                cache[index, 0, slot, :, :p] = k[0]
                cache[index, 1, slot, :, :p] = v[0]
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            a = a[0].transpose(0, 1).reshape(p, e)
            x = x + torch.addmm(layer["attn_proj"][1], a, layer["attn_proj"][0])
            x = self._mlp(layer, x)
        return x

    def decode_step(self, tokens, lengths, span, cache):
        """Next-token logits [B, vocab] for B sequences in cache slots 0..B-1.

        `tokens` [B] and `lengths` [B] are device int64 tensors: each sequence's input token and
        the number of tokens it has cached (so its position); `span` (host) >= max(lengths) + 1,
        the cache positions read, at most the cache's length."""
        b = tokens.shape[0]
        e, nh, hd = self.e, self.n_head, self.hd
        rows = torch.arange(b, device=tokens.device)
        x = self.w["wte"][tokens] + self.w["wpe"][lengths]
        # Position j of sequence i is attended iff j <= lengths[i] (its own new token included):
        # an additive mask (0 or -inf) made once per step rather than a boolean one that SDPA
        # would convert in every layer.
        attend = torch.arange(span, device=tokens.device)[None, :] <= lengths[:, None]
        mask = torch.zeros((b, 1, 1, span), dtype=x.dtype, device=x.device)
        mask.masked_fill_(~attend[:, None, None, :], float("-inf"))
        for index, layer in enumerate(self.w["layers"]):
            h = self._ln(x, layer["ln_1"])
            qkv = torch.addmm(layer["c_attn"][1], h, layer["c_attn"][0])
            q, k, v = qkv.view(b, 3, nh, hd).unbind(1)  # each [B, nh, hd]
            keys, values = cache[index, 0], cache[index, 1]
            keys[rows, :, lengths] = k
            values[rows, :, lengths] = v
            a = F.scaled_dot_product_attention(
                q.unsqueeze(2), keys[:b, :, :span], values[:b, :, :span], attn_mask=mask
            )
            x = x + torch.addmm(layer["attn_proj"][1], a.reshape(b, e), layer["attn_proj"][0])
            x = self._mlp(layer, x)
        return self._logits(x)


# ----------------------------------------------------------------------------- the stream


def read_stream(path, config, max_batch_flag):
    """[(prompt, max_new_tokens)], max_batch, each request's arrival (seconds after t0) and the
    objective ({"ttft_s", "tpot_s"} or None), every request checked against the model."""
    try:
        with open(path) as f:
            document = json.load(f)
    except OSError as error:
        raise BadInput(f"cannot read the stream {path}: {error.strerror}")
    except json.JSONDecodeError as error:
        raise BadInput(f"{path}: not JSON: {error}")
    if not isinstance(document, dict):
        raise BadInput(f"{path}: not a JSON object")
    stream = document.get("stream")
    if isinstance(stream, dict) and "requests" in stream:
        raw = stream["requests"]
    elif "requests" in document:
        raw = document["requests"]
    else:
        raise BadInput(f"{path}: no stream.requests")
    if not isinstance(raw, list) or not raw:
        raise BadInput(f"{path}: stream.requests is not a non-empty list")
    requests, arrivals = [], []
    vocab, n_ctx = config["vocab_size"], config["n_ctx"]
    for i, request in enumerate(raw):
        if not isinstance(request, dict):
            raise BadInput(f"{path}: request {i} is not an object")
        prompt, n = request.get("prompt"), request.get("max_new_tokens")
        if not (isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)):
            raise BadInput(f"{path}: request {i}: prompt is not a non-empty list of token ids")
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise BadInput(f"{path}: request {i}: token {bad[0]} outside the vocabulary of {vocab}")
        if not (isinstance(n, int) and not isinstance(n, bool) and n >= 1):
            raise BadInput(f"{path}: request {i}: max_new_tokens {n!r} is not a positive integer")
        if len(prompt) + n > n_ctx:
            raise BadInput(
                f"{path}: request {i}: prompt of {len(prompt)} tokens + {n} new tokens "
                f"exceeds n_ctx {n_ctx}"
            )
        arrival = request.get("arrival_s", 0)
        if arrival is None:
            arrival = 0
        if not (
            isinstance(arrival, (int, float))
            and not isinstance(arrival, bool)
            and math.isfinite(arrival)
            and arrival >= 0
        ):
            raise BadInput(f"{path}: request {i}: arrival_s {arrival!r} is not a time >= 0")
        if arrivals and arrival < arrivals[-1]:
            raise BadInput(
                f"{path}: request {i} arrives at {arrival} s, before request {i - 1} "
                f"({arrivals[-1]} s): arrivals must not decrease"
            )
        requests.append((prompt, n))
        arrivals.append(float(arrival))
    if max_batch_flag is not None:
        max_batch = max_batch_flag
    else:
        max_batch = document.get("max_batch")
        if max_batch is None and isinstance(stream, dict):
            max_batch = stream.get("max_batch")
        if max_batch is None:
            raise BadInput(f"{path}: no max_batch (give --max-batch)")
    if not (isinstance(max_batch, int) and not isinstance(max_batch, bool) and max_batch >= 1):
        raise BadInput(f"max_batch {max_batch!r} is not a positive integer")
    return requests, max_batch, arrivals, read_slo(path, document)


def read_slo(path, document):
    """The stream file's objective: {"ttft_s", "tpot_s"} (seconds) or None."""
    slo = document.get("slo")
    if slo is None:
        return None
    if not isinstance(slo, dict):
        raise BadInput(f"{path}: slo is not an object")
    found = {}
    for key in ("ttft", "tpot"):
        if f"{key}_s" in slo:
            value, scale = slo[f"{key}_s"], 1.0
        elif f"{key}_ms" in slo:
            value, scale = slo[f"{key}_ms"], 1e-3
        else:
            raise BadInput(f"{path}: slo has no {key}_s (or {key}_ms)")
        if not (
            isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
            and math.isfinite(value)
        ):
            raise BadInput(f"{path}: slo.{key}: {value!r} is not a positive time")
        found[f"{key}_s"] = value * scale
    return found


def objective(stream_slo, ttft_ms, tpot_ms):
    """The objective: the stream's, each part overridden by its flag (milliseconds); None when
    neither the stream nor both flags give one."""
    slo = dict(stream_slo) if stream_slo else {}
    for key, flag in (("ttft_s", ttft_ms), ("tpot_s", tpot_ms)):
        if flag is not None:
            if not (flag > 0 and math.isfinite(flag)):
                raise BadInput(f"--slo-{key[:4]}-ms {flag} is not a positive time")
            slo[key] = flag * 1e-3
    if not slo:
        return None
    missing = [k for k in ("ttft_s", "tpot_s") if k not in slo]
    if missing:
        raise BadInput(
            f"an objective needs both parts; {missing[0]} is missing (the stream has no slo: "
            "give --slo-ttft-ms and --slo-tpot-ms)"
        )
    return slo


def goodput(slo, ttft_s, tpot_s, span_s):
    """(requests meeting `slo`, those per second of `span_s`), or (None, None) without one.
    `ttft_s[i]` is request i's TTFT, `tpot_s[i]` its TPOT or None (a request of one token)."""
    if slo is None:
        return None, None
    met = sum(
        1
        for ttft, tpot in zip(ttft_s, tpot_s)
        if ttft <= slo["ttft_s"] and (tpot is None or tpot <= slo["tpot_s"])
    )
    return met, met / max(span_s, 1e-9)


# ----------------------------------------------------------------------------- serving


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def align(n):
    """`n` rounded up to a multiple of SPAN_ALIGN."""
    return -(-n // SPAN_ALIGN) * SPAN_ALIGN


def nearest_rank(values, p):
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(math.ceil(p / 100 * len(ordered)) - 1, 0)]


class StaticDecoder:
    """`--mode graphs`' decode step: the running sequences' next tokens, from static inputs.

    `inputs` [max_batch, 2] (int64, on the device) is allocated once: row i for slot i, its
    input token and the tokens it has cached (its position). `compute(b)` is the step over slots
    0..b-1: the model's decode step with attention over the cache's whole length S (a mask of
    each sequence's length built from `inputs` on the device, so one step serves every length)
    and the argmax (first index on ties) of the logits, also on the device. `capture()` records
    `compute(b)` once per batch size b = 1..max_batch in a `torch.cuda.CUDAGraph` (all of them in
    one memory pool: they are replayed one at a time and each output is read before the next
    replay), after warm-up runs on a side stream; `step` copies the host's tokens and lengths
    into `inputs` (one copy), replays graph b, or without capture runs `compute(b)` itself, and
    reads the tokens to the host (`.tolist()`)."""

    WARM_RUNS = 3

    def __init__(self, model, cache, max_batch, device):
        self.model = model
        self.cache = cache
        self.max_batch = max_batch
        self.device = device
        self.span = cache.shape[4]
        self.inputs = torch.zeros((max_batch, 2), dtype=torch.int64, device=device)
        # b -> (graph, its output: the next tokens [b], on the device)
        self.graphs = {}

    def compute(self, b):
        """The next tokens [b] (device int64) of slots 0..b-1 from `inputs`, uncaptured."""
        tokens, lengths = self.inputs[:b, 0], self.inputs[:b, 1]
        logits = self.model.decode_step(tokens, lengths, self.span, self.cache)
        return torch.argmax(logits, dim=-1)

    def capture(self):
        """One CUDA graph per batch size, each warmed up on a side stream before its capture,
        as PyTorch's CUDA graph notes ask. Writes into the cache at `inputs`' positions."""
        pool = torch.cuda.graph_pool_handle()
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        for b in range(1, self.max_batch + 1):
            side.wait_stream(current)
            with torch.cuda.stream(side):
                for _ in range(self.WARM_RUNS):
                    self.compute(b)
            current.wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                out = self.compute(b)
            self.graphs[b] = (graph, out)
        torch.cuda.synchronize(self.device)

    def step(self, tokens, lengths):
        """The next token of each of the b = len(tokens) running sequences (host lists)."""
        b = len(tokens)
        self.inputs[:b].copy_(torch.tensor(list(zip(tokens, lengths)), dtype=torch.int64))
        if self.graphs:
            graph, out = self.graphs[b]
            graph.replay()
        else:
            out = self.compute(b)
        return out.tolist()


class Server:
    """Continuous batching over a static, slotted, contiguous KV cache; decode steps eager
    (`mode` "eager") or through `StaticDecoder` ("graphs": CUDA graphs if `capture`)."""

    def __init__(self, model, requests, max_batch, device, arrivals=None, slo=None,
                 mode="eager", capture=True):
        if mode not in MODES:
            raise ValueError(f"mode {mode!r} is not one of {MODES}")
        self.model = model
        self.requests = requests
        # Each request's arrival, seconds after t0 (non-decreasing); None: all at t0.
        self.arrivals = list(arrivals) if arrivals is not None else [0.0] * len(requests)
        if len(self.arrivals) != len(requests):
            raise ValueError("one arrival per request")
        self.slo = slo
        self.max_batch = max_batch
        self.device = device
        c = model.config
        # The most tokens a request caches (its last token is never fed back), rounded up to a
        # multiple of SPAN_ALIGN as every span read is.
        self.span_max = align(max(len(p) + n - 1 for p, n in requests))
        self.cache = torch.zeros(
            (c["n_layer"], 2, max_batch, model.n_head, self.span_max, model.hd),
            dtype=model.dtype, device=device,
        )
        self.token_bytes = 2 * c["n_layer"] * c["n_embd"] * self.cache.element_size()
        self.mode = mode
        self.capture = capture and mode == "graphs"
        self.decoder = None
        if mode == "graphs":
            self.decoder = StaticDecoder(model, self.cache, max_batch, device)
        self.warm_up_s = 0.0

    def _move(self, dst, src, length):
        """The sequence of slot `src` into slot `dst`: its `length` cached tokens, every layer."""
        self.cache[:, :, dst, :, :length] = self.cache[:, :, src, :, :length]

    def warm_up(self):
        """Untimed: prefills of a few lengths (powers of two up to the longest prompt, the longest
        and the first request's prompt, each a prefix of it), then one decode step at each batch
        size from 1 to max_batch over copies of the first prompt's sequence (graphs: captured,
        one graph per batch size, or without capture run once each)."""
        started = time.perf_counter()
        longest = max((p for p, _ in self.requests), key=len)
        lengths = {1 << k for k in range(len(longest).bit_length()) if 1 << k <= len(longest)}
        lengths.add(len(longest))
        with torch.inference_mode():
            for length in sorted(lengths):
                tokens = torch.tensor(longest[:length], dtype=torch.int64, device=self.device)
                torch.argmax(self.model.full(tokens, self.cache, 0)).item()
            # The decode step writes at position `length`, inside the cache.
            prompt = self.requests[0][0][: self.span_max - 1]
            tokens = torch.tensor(prompt, dtype=torch.int64, device=self.device)
            first = int(torch.argmax(self.model.full(tokens, self.cache, 0)).item())
            length = len(prompt)
            for slot in range(1, self.max_batch):
                self._move(slot, 0, length)
            if self.decoder is not None:
                # Every slot holds the first prompt's sequence; the steps write at `length`.
                self.decoder.inputs[:, 0].fill_(first)
                self.decoder.inputs[:, 1].fill_(length)
                if self.capture:
                    self.decoder.capture()
                else:
                    for b in range(1, self.max_batch + 1):
                        self.decoder.compute(b).tolist()
            elif length < self.span_max:
                for b in range(1, self.max_batch + 1):
                    inputs = torch.full((b,), first, dtype=torch.int64, device=self.device)
                    lengths = torch.full((b,), length, dtype=torch.int64, device=self.device)
                    span = min(align(length + 1), self.span_max)
                    logits = self.model.decode_step(inputs, lengths, span, self.cache)
                    torch.argmax(logits, dim=-1).tolist()
        sync(self.device)
        self.warm_up_s = time.perf_counter() - started

    def serve(self):
        """Serve every request; the figures and each request's tokens."""
        model, device, requests, arrivals = self.model, self.device, self.requests, self.arrivals
        outputs = [[] for _ in requests]
        first_at = [0.0] * len(requests)
        last_at = [0.0] * len(requests)
        # Running sequences in slot order: [request index, cached tokens, next input token].
        running = []
        waiting = 0  # the next request to admit (FIFO)
        in_flight = []
        step_s = []  # each decode step's host time: its inputs built to its tokens on the host
        kv_used_peak = 0
        sync(device)
        t0 = time.perf_counter()
        with torch.inference_mode():
            while waiting < len(requests) or running:
                # Admit (FIFO) the arrived while fewer than max_batch run, then prefill each
                # admitted request alone, its first token read at once; one of a single token
                # leaves at once (its slot is free for the next round's admissions, not this one's).
                # With none running and none arrived, sleep until the next arrival.
                if not running and waiting < len(requests):
                    ahead = t0 + arrivals[waiting] - time.perf_counter()
                    if ahead > 0:
                        time.sleep(ahead)
                admitted = []
                since_t0 = time.perf_counter() - t0
                while (
                    waiting < len(requests)
                    and len(running) + len(admitted) < self.max_batch
                    and arrivals[waiting] <= since_t0
                ):
                    admitted.append(waiting)
                    waiting += 1
                for r in admitted:
                    prompt, n = requests[r]
                    slot = len(running)
                    tokens = torch.tensor(prompt, dtype=torch.int64, device=device)
                    token = int(torch.argmax(model.full(tokens, self.cache, slot)).item())
                    now = time.perf_counter()
                    outputs[r].append(token)
                    first_at[r] = last_at[r] = now
                    running.append([r, len(prompt), token])
                    used = sum(s[1] for s in running) * self.token_bytes
                    kv_used_peak = max(kv_used_peak, used)
                    if n == 1:
                        running.pop()  # the last slot: nothing to move
                if not running:
                    continue
                # One decode step over every running sequence.
                b = len(running)
                in_flight.append(b)
                step_start = time.perf_counter()
                if self.decoder is not None:
                    chosen = self.decoder.step([s[2] for s in running], [s[1] for s in running])
                else:
                    inputs = torch.tensor([s[2] for s in running], dtype=torch.int64).to(device)
                    host_lengths = [s[1] for s in running]
                    lengths = torch.tensor(host_lengths, dtype=torch.int64).to(device)
                    span = min(align(max(host_lengths) + 1), self.span_max)
                    logits = model.decode_step(inputs, lengths, span, self.cache)
                    chosen = torch.argmax(logits, dim=-1).tolist()
                now = time.perf_counter()
                step_s.append(now - step_start)
                for s, token in zip(running, chosen):
                    s[1] += 1
                    s[2] = token
                    outputs[s[0]].append(token)
                    last_at[s[0]] = now
                kv_used_peak = max(kv_used_peak, sum(s[1] for s in running) * self.token_bytes)
                # Retire the finished; the last running sequence fills each freed slot.
                slot = 0
                while slot < len(running):
                    r = running[slot][0]
                    if len(outputs[r]) < requests[r][1]:
                        slot += 1
                        continue
                    last = len(running) - 1
                    if slot != last:
                        self._move(slot, last, running[last][1])
                        running[slot] = running[last]
                    running.pop()
        sync(device)
        end = max(last_at)
        elapsed = max(end - t0, 1e-9)
        ttft_s = [first_at[r] - (t0 + arrivals[r]) for r in range(len(requests))]
        tpot_s = [
            (last_at[r] - first_at[r]) / (n - 1) if n > 1 else None
            for r, (_, n) in enumerate(requests)
        ]
        ttft = [t * 1e3 for t in ttft_s]
        tpot = [t * 1e3 for t in tpot_s if t is not None]
        met, rate = goodput(self.slo, ttft_s, tpot_s, elapsed)
        generated = sum(len(o) for o in outputs)
        figures = {
            "requests_count": len(requests),
            "generated_tokens": generated,
            "generated_tokens_per_s": generated / elapsed,
            "ttft_ms_p50": nearest_rank(ttft, 50),
            "ttft_ms_p99": nearest_rank(ttft, 99),
            "tpot_ms_p50": nearest_rank(tpot, 50),
            "tpot_ms_p99": nearest_rank(tpot, 99),
            "goodput_rps": rate,
            "goodput_requests": met,
            "in_flight_mean": sum(in_flight) / len(in_flight) if in_flight else 0.0,
            "in_flight_max": max(in_flight) if in_flight else 0,
            "decode_steps": len(in_flight),
            "decode_step_ms_mean": sum(step_s) * 1e3 / len(step_s) if step_s else 0.0,
            "kv_reserved_bytes_peak": self.cache.numel() * self.cache.element_size(),
            "kv_used_bytes_peak": kv_used_peak,
            "wall_s": elapsed,
        }
        return figures, outputs


def greedy_reference(model, prompt, n, device):
    """`n` greedy tokens with no cache: a full forward over the whole sequence for each."""
    sequence = list(prompt)
    out = []
    with torch.inference_mode():
        for _ in range(n):
            logits = model.full(torch.tensor(sequence, dtype=torch.int64, device=device))
            token = int(torch.argmax(logits).item())
            out.append(token)
            sequence.append(token)
    return out


def top2_gap(model, sequence, device):
    """The gap between the two largest next-token logits after `sequence`, no cache."""
    with torch.inference_mode():
        logits = model.full(torch.tensor(sequence, dtype=torch.int64, device=device))
        top = torch.topk(logits, 2).values.tolist()
    return top[0] - top[1]


# ----------------------------------------------------------------------------- checking


def check(path, requests, outputs, model, device, name="torch", gap=None):
    """`agreement` against our JSON's sides; the first mismatch names this side's token
    `name` and its gap `{name}_top2_gap`, computed by `gap(sequence)` (default: this model's
    `top2_gap`)."""
    if gap is None:
        gap = lambda sequence: top2_gap(model, sequence, device)
    try:
        with open(path) as f:
            ours = json.load(f)
    except OSError as error:
        raise BadInput(f"cannot read {path}: {error.strerror}")
    except json.JSONDecodeError as error:
        raise BadInput(f"{path}: not JSON: {error}")
    sides = ours.get("sides") if isinstance(ours, dict) else None
    if not isinstance(sides, dict) or not any(s in sides for s in SIDES):
        raise BadInput(f"{path}: no sides.paged, sides.contiguous or sides.naive")
    agreement = {}
    for side in SIDES:
        if side not in sides:
            continue
        theirs = sides[side].get("requests") if isinstance(sides[side], dict) else None
        if not isinstance(theirs, list):
            raise BadInput(f"{path}: sides.{side}.requests is not a list")
        if len(theirs) != len(requests):
            raise BadInput(
                f"{path}: sides.{side} has {len(theirs)} requests, the stream {len(requests)}"
            )
        identical = tokens = equal = 0
        first = None
        for i, ((prompt, _), mine, their) in enumerate(zip(requests, outputs, theirs)):
            if not isinstance(their, dict) or not isinstance(their.get("output"), list):
                raise BadInput(f"{path}: sides.{side}.requests[{i}] has no output list")
            if their.get("prompt", prompt) != prompt:
                raise BadInput(f"{path}: sides.{side}.requests[{i}]'s prompt is not the stream's")
            out = their["output"]
            tokens += len(mine)
            equal += sum(a == b for a, b in zip(mine, out))
            if out == mine:
                identical += 1
            elif first is None:
                shorter = min(len(mine), len(out))
                index = next((j for j, (a, b) in enumerate(zip(mine, out)) if a != b), shorter)
                first = {
                    "request": i,
                    "index": index,
                    "ours": out[index] if index < len(out) else None,
                    name: mine[index] if index < len(mine) else None,
                    f"{name}_top2_gap": (
                        gap(prompt + mine[:index]) if index < len(mine) else None
                    ),
                }
        agreement[side] = {
            "requests": len(requests),
            "identical": identical,
            "tokens": tokens,
            "tokens_equal": equal,
            "first_mismatch": first,
        }
    return agreement


# ----------------------------------------------------------------------------- teacher forcing


def read_side(path, side, config):
    """[(prompt, output)] of `sides.<side>.requests` of our JSON, each checked against the model
    (token ids in the vocabulary, the sequence fed back within n_ctx)."""
    try:
        with open(path) as f:
            ours = json.load(f)
    except OSError as error:
        raise BadInput(f"cannot read {path}: {error.strerror}")
    except json.JSONDecodeError as error:
        raise BadInput(f"{path}: not JSON: {error}")
    sides = ours.get("sides") if isinstance(ours, dict) else None
    if not isinstance(sides, dict) or side not in sides:
        found = sorted(sides) if isinstance(sides, dict) else []
        raise BadInput(f"{path}: no sides.{side} (sides: {', '.join(found) or 'none'})")
    if not isinstance(sides[side], dict) or "error" in sides[side]:
        raise BadInput(f"{path}: sides.{side} holds no result: {sides[side]!r:.200}")
    raw = sides[side].get("requests")
    if not isinstance(raw, list) or not raw:
        raise BadInput(f"{path}: sides.{side}.requests is not a non-empty list")
    return [check_pair(path, f"sides.{side}.requests[{i}]", r, config) for i, r in enumerate(raw)]


def check_pair(path, where, request, config):
    """(prompt, output) of one request of a JSON, checked against the model."""
    if not isinstance(request, dict):
        raise BadInput(f"{path}: {where} is not an object")
    prompt, output = request.get("prompt"), request.get("output")
    for name, tokens in (("prompt", prompt), ("output", output)):
        if not (isinstance(tokens, list) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in tokens
        )):
            raise BadInput(f"{path}: {where}.{name} is not a list of token ids")
        bad = [t for t in tokens if not 0 <= t < config["vocab_size"]]
        if bad:
            raise BadInput(
                f"{path}: {where}.{name}: token {bad[0]} outside the vocabulary of "
                f"{config['vocab_size']}"
            )
    if not prompt:
        raise BadInput(f"{path}: {where}.prompt is empty")
    if len(prompt) + len(output) - 1 > config["n_ctx"]:
        raise BadInput(
            f"{path}: {where}: {len(prompt)} prompt and {len(output)} output tokens exceed "
            f"n_ctx {config['n_ctx']}"
        )
    return prompt, output


def teacher_force(model, pairs, device, near_tie=NEAR_TIE):
    """Each (prompt, output) of `pairs` against `model` (the float64 reference), teacher-forced:
    one forward (no cache) over prompt + output[:-1], and at each generated position j the
    reference's argmax (first index on ties) after prompt + output[:j] against output[j].

    A disagreement's gap = the reference's top-1 logit - its logit of output[j] (>= 0); a
    near-tie when the gap is at most `near_tie`. Returned: {"requests", "tokens", "equal",
    "equal_rate", "disagreements", "near_ties" (disagreements within the gap, every position),
    "unexplained" (requests whose first disagreement is beyond the gap: after it the sequence
    is no longer the reference's greedy one, so later disagreements are not counted here),
    "beyond_gap_after_first" (the other disagreements beyond the gap; disagreements = near_ties
    + unexplained + beyond_gap_after_first), "equal_until_near_tie" (requests equal to the
    reference's argmax at every position up to their first disagreement, that one a near-tie
    or none at all: requests - unexplained), "equal_until_near_tie_rate" (of requests),
    "first_divergence" and "first_divergence_gap" (per request: the index of the first
    disagreement in its output and its gap, or null), "near_tie_gap"}."""
    tokens = equal = near = unexplained = beyond_after = 0
    first, first_gap = [], []
    with torch.inference_mode():
        for prompt, output in pairs:
            if not output:
                first.append(None)
                first_gap.append(None)
                continue
            sequence = torch.tensor(prompt + output[:-1], dtype=torch.int64, device=device)
            logits = model.all_logits(sequence)[len(prompt) - 1:]
            chosen = torch.tensor(output, dtype=torch.int64, device=device)
            top = torch.argmax(logits, dim=-1)
            rows = torch.arange(len(output), device=device)
            gaps = (logits[rows, top] - logits[rows, chosen]).tolist()
            agree = (top == chosen).tolist()
            tokens += len(output)
            equal += sum(agree)
            index = next((j for j, same in enumerate(agree) if not same), None)
            first.append(index)
            first_gap.append(gaps[index] if index is not None else None)
            for j, same in enumerate(agree):
                if same:
                    continue
                if gaps[j] <= near_tie:
                    near += 1
                elif j == index:
                    unexplained += 1
                else:
                    beyond_after += 1
    requests = len(pairs)
    return {
        "requests": requests,
        "tokens": tokens,
        "equal": equal,
        "equal_rate": equal / tokens if tokens else 1.0,
        "disagreements": tokens - equal,
        "near_ties": near,
        "unexplained": unexplained,
        "beyond_gap_after_first": beyond_after,
        "equal_until_near_tie": requests - unexplained,
        "equal_until_near_tie_rate": (requests - unexplained) / requests if requests else 1.0,
        "near_tie_gap": near_tie,
        "first_divergence": first,
        "first_divergence_gap": first_gap,
    }


def describe_forcing(name, t):
    """One line of a teacher-forcing result."""
    text = (
        f"{name}: {t['equal_until_near_tie']}/{t['requests']} requests equal up to a near-tie, "
        f"{t['equal']}/{t['tokens']} tokens equal, {t['near_ties']} near-ties, "
        f"{t['unexplained']} unexplained"
    )
    worst = [
        (g, i, j) for i, (j, g) in enumerate(zip(t["first_divergence"], t["first_divergence_gap"]))
        if j is not None and g > t["near_tie_gap"]
    ]
    if worst:
        g, i, j = max(worst)
        text += f" (largest: request {i} token {j}, gap {g:.3g})"
    return text


# ----------------------------------------------------------------------------- main


def run(args):
    if args.device:
        device = torch.device(args.device)
    else:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BadInput("--device cuda but no CUDA device")
    if args.mode == "graphs" and device.type != "cuda" and not args.uncaptured:
        raise BadInput(
            f"--mode graphs replays CUDA graphs, which need a CUDA device (this run's is "
            f"{device.type}): use --mode eager"
        )
    if args.uncaptured and args.mode != "graphs":
        raise BadInput("--uncaptured goes with --mode graphs")
    if not args.teacher_force and (args.side is not None or args.near_tie is not None):
        raise BadInput("--side and --near-tie go with --teacher-force OURS_JSON")
    near_tie = NEAR_TIE if args.near_tie is None else args.near_tie
    if not (math.isfinite(near_tie) and near_tie >= 0):
        raise BadInput(f"--near-tie {near_tie} is not a gap >= 0")
    side = args.side or "paged"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.enable_cudnn_sdp(args.cudnn_sdpa == "on")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"

    if args.stream is None:
        if not args.teacher_force:
            raise BadInput("--stream FILE is needed (or --teacher-force OURS_JSON alone)")
        # Teacher forcing of our JSON alone: no serving.
        config, reference = load_model(args.weights, device, torch.float64)
        pairs = read_side(args.teacher_force, side, config)
        print(f"device: {name}, torch {torch.__version__}; GPT-2 {config}; teacher forcing of "
              f"{len(pairs)} requests against float64")
        forced = teacher_force(Gpt2(config, reference), pairs, device, near_tie)
        print(f"teacher forcing against float64 (near-tie gap {near_tie:g}): "
              + describe_forcing(f"ours {side}", forced))
        result = {
            "device": name,
            "torch": torch.__version__,
            "model": config,
            "teacher_forcing": {
                "reference": "float64",
                "near_tie_gap": near_tie,
                "ours": {"json": args.teacher_force, "side": side, **forced},
            },
        }
        write_json(args.json, result)
        return result

    config, weights = load_model(args.weights, device, SERVE_DTYPES[args.dtype])
    requests, max_batch, arrivals, stream_slo = read_stream(args.stream, config, args.max_batch)
    slo = objective(stream_slo, args.slo_ttft_ms, args.slo_tpot_ms)
    model = Gpt2(config, weights)
    timing = (
        f"arrivals over {arrivals[-1]:.2f} s" if arrivals[-1] > 0 else "all arriving at t0"
    )
    graphs = ""
    if args.mode == "graphs":
        graphs = (
            f"; decode steps replayed from CUDA graphs (batch sizes 1..{max_batch})"
            if not args.uncaptured else "; graph mode's static decode step, not captured"
        )
    print(
        f"device: {name}, torch {torch.__version__}, {args.dtype}, TF32 off; GPT-2 {config}; "
        f"{len(requests)} requests ({timing}), max batch {max_batch}{graphs}"
    )

    # Our JSON read before serving, so that a bad one is refused at once.
    pairs = read_side(args.teacher_force, side, config) if args.teacher_force else None
    server = Server(model, requests, max_batch, device, arrivals, slo, mode=args.mode,
                    capture=not args.uncaptured)
    server.warm_up()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    figures, outputs = server.serve()
    if device.type == "cuda":
        figures["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        figures["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
    else:
        figures["peak_allocated_bytes"] = figures["peak_reserved_bytes"] = 0
    figures["weights_bytes"] = weights_bytes(weights)
    figures["requests"] = [{"prompt": p, "output": o} for (p, _), o in zip(requests, outputs)]

    mib = lambda b: f"{b / 2**20:.1f} MiB"
    print(
        f"{figures['generated_tokens']} tokens in {figures['wall_s']:.3f} s: "
        f"{figures['generated_tokens_per_s']:.1f} tokens/s; TTFT p50/p99 "
        f"{figures['ttft_ms_p50']:.2f}/{figures['ttft_ms_p99']:.2f} ms; TPOT p50/p99 "
        f"{figures['tpot_ms_p50']:.3f}/{figures['tpot_ms_p99']:.3f} ms; in flight mean "
        f"{figures['in_flight_mean']:.2f} max {figures['in_flight_max']}"
    )
    if slo is not None:
        print(
            f"goodput {figures['goodput_rps']:.2f} requests/s ({figures['goodput_requests']} of "
            f"{len(requests)} within TTFT {slo['ttft_s'] * 1e3:g} ms, TPOT "
            f"{slo['tpot_s'] * 1e3:g} ms)"
        )
    print(
        f"KV reserved {mib(figures['kv_reserved_bytes_peak'])}, used at peak "
        f"{mib(figures['kv_used_bytes_peak'])}; peak allocated "
        f"{mib(figures['peak_allocated_bytes'])}, reserved {mib(figures['peak_reserved_bytes'])}; "
        f"weights {mib(figures['weights_bytes'])}"
    )
    if args.mode == "graphs":
        print(
            f"decode step {figures['decode_step_ms_mean']:.3f} ms (mean of "
            f"{figures['decode_steps']}); warm-up {server.warm_up_s:.2f} s"
            + (f" with {max_batch} graphs captured" if server.capture else "")
        )
    result = {
        "device": name,
        "torch": torch.__version__,
        "tf32": False,
        "dtype": args.dtype,
        "mode": args.mode,
        "cudnn_sdpa": args.cudnn_sdpa == "on",
        "model": config,
        "max_batch": max_batch,
        "prefill": "per_request",
        "arrivals": arrivals[-1] > 0,
        "slo": slo,
        "warm_up_s": server.warm_up_s,
        "side": figures,
    }
    if args.mode == "graphs":
        result["graphs"] = {
            "captured": server.capture,
            "batch_sizes": list(range(1, max_batch + 1)) if server.capture else [],
            "span": server.span_max,
        }
    if args.check:
        agreement = check(args.check, requests, outputs, model, device)
        result["agreement"] = agreement
        parts = []
        for side_name, a in agreement.items():
            text = (
                f"{side_name}: {a['identical']}/{a['requests']} requests identical, "
                f"{a['tokens_equal']}/{a['tokens']} tokens"
            )
            m = a["first_mismatch"]
            if m:
                gap = m["torch_top2_gap"]
                gap = f"{gap:.3g}" if gap is not None else "n/a"
                text += (
                    f" (first mismatch: request {m['request']} token {m['index']}: ours "
                    f"{m['ours']}, torch {m['torch']}, torch top-2 gap {gap})"
                )
            parts.append(text)
        print("agreement: " + "; ".join(parts))
    if args.teacher_force:
        # Our side's tokens and this run's own, each against the float64 model.
        _, reference = load_model(args.weights, device, torch.float64)
        reference = Gpt2(config, reference)
        ours = teacher_force(reference, pairs, device, near_tie)
        mine = [(p, o) for (p, _), o in zip(requests, outputs)]
        own = teacher_force(reference, mine, device, near_tie)
        result["teacher_forcing"] = {
            "reference": "float64",
            "near_tie_gap": near_tie,
            "ours": {"json": args.teacher_force, "side": side, **ours},
            "torch": {"dtype": args.dtype, "mode": args.mode, **own},
        }
        print(f"teacher forcing against float64 (near-tie gap {near_tie:g}): "
              + describe_forcing(f"ours {side}", ours) + "; "
              + describe_forcing(f"torch {args.dtype}", own))
    write_json(args.json, result)
    return result


def write_json(path, result):
    if not path:
        return
    try:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
    except OSError as error:
        raise BadInput(f"cannot write {path}: {error.strerror}")
    print(f"wrote {path}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", required=True, help="GPT-2 safetensors (HF layout)")
    parser.add_argument("--stream", help="the request stream (our example's JSON)")
    parser.add_argument("--max-batch", type=int, help="override the stream's max_batch")
    parser.add_argument("--device", choices=["cuda", "cpu"], help="default: cuda if available")
    parser.add_argument("--dtype", choices=list(SERVE_DTYPES), default="f32",
                        help="weights, activations and KV cache (default f32)")
    parser.add_argument("--mode", choices=MODES, default="eager",
                        help="decode steps eager, or replayed from CUDA graphs (default eager)")
    parser.add_argument("--cudnn-sdpa", choices=["on", "off"], default="off",
                        help="SDPA's cuDNN backend (default off: a plan built per new shape)")
    # Testing: graph mode's static decode step run without capture (on the CPU too).
    parser.add_argument("--uncaptured", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--check", metavar="OURS_JSON", help="compare the tokens with ours")
    parser.add_argument("--teacher-force", metavar="OURS_JSON",
                        help="our side's tokens (and this run's) against a float64 forward")
    parser.add_argument("--side", help="the side of OURS_JSON (default paged; any name under "
                        "its `sides`, e.g. a mode of hf_serve.py's JSON)")
    parser.add_argument("--near-tie", type=float, metavar="GAP",
                        help=f"a disagreement within this logit gap is a near-tie ({NEAR_TIE:g})")
    parser.add_argument("--slo-ttft-ms", type=float, help="the objective's TTFT (overrides slo)")
    parser.add_argument("--slo-tpot-ms", type=float, help="the objective's TPOT (overrides slo)")
    args = parser.parse_args(argv)
    try:
        run(args)
    except BadInput as error:
        print(f"{os.path.basename(sys.argv[0]) or 'serve_gpt.py'}: error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
