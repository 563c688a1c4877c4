"""Hugging Face transformers' continuous batching as a peer of `serve_gpt`: the same weights file
and request stream, served by `GPT2LMHeadModel` through the library's own continuous-batching
manager (paged attention), greedy, each mode in turn.

    python3 benches/torch/hf_serve.py --weights gpt2.safetensors --stream ours.json \\
        --json hf.json --check ours.json [--mode paged_sdpa,paged_sdpa_graphs] [--dtype f32]

Written against transformers 5.17 (`ContinuousMixin.init_continuous_batching`,
`ContinuousBatchingConfig`, `ContinuousBatchingManager.add_request`/`get_result`); a version
without a piece this script needs is refused with a message naming it.

`--weights FILE`: GPT-2 in Hugging Face's safetensors layout, read by `serve_gpt.py`'s parser
(F32, F16 or BF16, names with or without `transformer.`). The configuration comes from the file's
`__metadata__` (`n_layer`, `n_embd`, `n_head`, `n_ctx`, `vocab_size`, decimal strings) or, without
it, from a `config.json` beside the file (`n_positions` or `n_ctx` for the context). The model is
`GPT2LMHeadModel` of that configuration (GELU tanh, layer norm eps 1e-5, no dropout), every
parameter loaded from the file: the LM head tied to `wte`, unless the file holds an
`lm_head.weight` of its own (then untied). `--dtype f32|f16` (default f32, TF32 off): the model
is converted to that dtype after loading, and with it its activations, the manager's KV cache
(the library keeps it in the model's dtype; `cb_config.cache_dtype` records it) and the logits
whose argmax is taken. SDPA's cuDNN backend is off unless `--cudnn-sdpa on` (the JSON's
"cudnn_sdpa"), as in `serve_gpt.py`, which says why (a plan built per new shape in f16).

`--stream FILE`: as `serve_gpt.py` reads it: `stream.requests` = [{"prompt", "max_new_tokens",
"arrival_s"}], `max_batch` (or `--max-batch`), the objective `slo` (or `--slo-ttft-ms`,
`--slo-tpot-ms`). Every request generates exactly `max_new_tokens` tokens greedily
(`do_sample=False`: `torch.argmax`), with no end-of-sequence token (`eos_token_id=-1` for the
manager and for every request; the manager then stops a request only at `max_new_tokens`). At
most `max_batch` requests are scheduled in one step (`max_requests_per_batch`); the KV cache's
blocks and the tokens per step are the library's own choice from free memory unless
`--num-blocks`, `--block-size` or `--max-batch-tokens` give them; prefix sharing (block
sharing) is the library's default, on, unless `--prefix-sharing off`.

`--mode`, a comma-separated list, each served in turn on a fresh manager (default
`paged_sdpa,paged_sdpa_graphs`):

- `paged_sdpa`: attention `paged|sdpa`, CUDA graphs off;
- `paged_sdpa_graphs`: `paged|sdpa`, CUDA graphs on (`use_cuda_graph=True`);
- `paged_eager`: `paged|eager`, CUDA graphs off;
- `paged_flash`: `paged|flash_attention_2` (needs the flash-attn package and f16), graphs as the
  library decides.

A mode that fails (an exception, a failed request, a stopped generation thread, more than
`--timeout-s` seconds) is recorded as {"error": ...} in `sides.<mode>` and the next mode runs.

Warm-up (untimed, before t0): `manager.warmup()` (CUDA graphs captured where on), then the
manager started and served, to the end, one request of the longest prompt's length and
`max_batch` concurrent requests of the first prompt's length, each of 4 tokens; their prompts are
synthetic (token i = (7919 * i + 13) mod vocab), so that none of the stream's prompt blocks is in
the prefix cache at t0. Then the peak memory statistics are reset.

Timed: t0 = after the warm-up; this script's thread adds request i to the manager when
`t0 + arrival_s` has passed (it sleeps until then, reading finished results meanwhile) and the
manager's own thread serves. TTFT = the time the manager recorded the request's first token
(`record_timestamps=True`: the manager's time stamp when it wrote the token into the request
state, on the host) - (t0 + arrival_s); TPOT = (the last token's time stamp - the first's) /
(max_new_tokens - 1). If the installed version has no `record_timestamps`, tokens are streamed
(`streaming=True`) and the times are when this thread received each; if it has neither, TTFT is
the time the finished result was received (`ttft_source` in the JSON says which). The span =
the last token's time - t0; generated_tokens_per_s, p50/p99 (nearest rank) and goodput_rps
exactly as `serve_gpt.py`. In flight: the requests in each scheduled step (read by wrapping the
manager's scheduler; null if the version hides it).

`--check OURS.json`: as `serve_gpt.py --check`, per mode, the side's token named `hf` and
`hf_top2_gap` the gap between the two largest logits of this model's plain forward (attention
`sdpa`, no cache) at the first mismatch.

The JSON: {"device", "torch", "transformers", "tf32": false, "dtype", "cudnn_sdpa", "model",
"max_batch", "arrivals", "slo", "modes", "sides": {mode: {"attn_implementation", "cb_config"
(the manager's resolved settings: block size, blocks, tokens per step, CUDA graphs, async
batching, block sharing, the KV cache's dtype), "requests_count", "generated_tokens",
"generated_tokens_per_s", "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p99",
"goodput_rps", "goodput_requests", "ttft_source", "length_mismatches" (requests not of exactly
max_new_tokens tokens), "in_flight_mean", "in_flight_max", "steps", "peak_allocated_bytes",
"peak_reserved_bytes", "warm_up_s", "wall_s", "requests": [{"prompt", "output"}]} or
{"error"}}, "agreement": {mode: {side: ...}}}.
Bad input is refused with a message and exit status 2 (as `serve_gpt.py`); exit status 1 when
every mode failed.
"""

import argparse
import inspect
import json
import os
import sys
import time
import traceback

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import serve_gpt  # noqa: E402
from serve_gpt import BadInput  # noqa: E402

# Each mode: the attention implementation (after "paged|") and ContinuousBatchingConfig fields.
MODES = {
    "paged_sdpa": ("sdpa", {"use_cuda_graph": False}),
    "paged_sdpa_graphs": ("sdpa", {"use_cuda_graph": True}),
    "paged_eager": ("eager", {"use_cuda_graph": False}),
    "paged_flash": ("flash_attention_2", {}),
}
DEFAULT_MODES = "paged_sdpa,paged_sdpa_graphs"
WARM_TOKENS = 4


def need(condition, what):
    """Refuse an installed transformers without `what`."""
    if not condition:
        raise BadInput(f"transformers {transformers_version()}: {what} (this script follows 5.17)")


def transformers_version():
    try:
        import transformers

        return transformers.__version__
    except ImportError:
        return "(not installed)"


# ----------------------------------------------------------------------------- the model


def read_config(path, metadata):
    """{n_layer, n_embd, n_head, n_ctx, vocab_size} from `__metadata__` or a config.json beside."""
    if all(k in metadata for k in serve_gpt.CONFIG_KEYS):
        config = {}
        for key in serve_gpt.CONFIG_KEYS:
            value = metadata[key]
            if not (isinstance(value, str) and value.isdigit() and int(value) > 0):
                raise BadInput(f"{path}: __metadata__ {key} {value!r} is not a positive integer")
            config[key] = int(value)
        return config
    beside = os.path.join(os.path.dirname(os.path.abspath(path)), "config.json")
    try:
        with open(beside) as f:
            document = json.load(f)
    except OSError:
        raise BadInput(
            f"{path}: __metadata__ lacks {[k for k in serve_gpt.CONFIG_KEYS if k not in metadata]} "
            f"and there is no {beside}"
        )
    except json.JSONDecodeError as error:
        raise BadInput(f"{beside}: not JSON: {error}")
    config = {}
    for key, names in (
        ("n_layer", ["n_layer"]), ("n_embd", ["n_embd"]), ("n_head", ["n_head"]),
        ("n_ctx", ["n_positions", "n_ctx"]), ("vocab_size", ["vocab_size"]),
    ):
        value = next((document[n] for n in names if n in document), None)
        if not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
            raise BadInput(f"{beside}: {' or '.join(names)} is {value!r}, not a positive integer")
        config[key] = value
    return config


def build_model(path, device, dtype):
    """GPT2LMHeadModel of the file's configuration with every parameter from the file."""
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as error:
        raise BadInput(f"cannot import transformers' GPT-2: {error}")
    metadata, entries, load = serve_gpt.read_safetensors(path)
    config = read_config(path, metadata)
    if config["n_embd"] % config["n_head"]:
        raise BadInput(f"{path}: n_embd {config['n_embd']} is not a multiple of n_head")
    prefix = "transformer." if "transformer.wte.weight" in entries else ""
    untied = "lm_head.weight" in entries
    hf_config = GPT2Config(
        vocab_size=config["vocab_size"], n_positions=config["n_ctx"], n_embd=config["n_embd"],
        n_layer=config["n_layer"], n_head=config["n_head"], activation_function="gelu_new",
        layer_norm_epsilon=serve_gpt.LN_EPS, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        tie_word_embeddings=not untied, eos_token_id=None, bos_token_id=None,
    )
    model = GPT2LMHeadModel(hf_config)
    expected = model.state_dict()
    buffers = {name for name, _ in model.named_buffers()}
    state = {}
    for name, tensor in expected.items():
        if name == "lm_head.weight" and not untied:
            continue  # tied to transformer.wte.weight
        source = name if name == "lm_head.weight" else prefix + name[len("transformer."):]
        if source not in entries:
            if name in buffers:
                continue  # a buffer some versions keep (the causal mask), not a weight
            raise BadInput(f"{path}: missing tensor {source}")
        found = entries[source][1]
        if list(found) != list(tensor.shape):
            raise BadInput(
                f"{path}: tensor {source} has shape {found}, expected {list(tensor.shape)}"
            )
        state[name] = load(source)
    result = model.load_state_dict(state, strict=False)
    left = [
        k for k in result.missing_keys
        if not (k == "lm_head.weight" and not untied) and k not in buffers
    ]
    if left:
        raise BadInput(f"{path}: parameters not loaded: {left[:5]}")
    if not untied and model.lm_head.weight.data_ptr() != model.transformer.wte.weight.data_ptr():
        model.lm_head.weight = model.transformer.wte.weight
    model = model.to(device=device, dtype=dtype).eval()
    return config, model


def plain_top2_gap(model, sequence, device):
    """The gap between the two largest next-token logits after `sequence`: a plain forward."""
    previous = model.config._attn_implementation
    try:
        model.set_attn_implementation("sdpa")
        with torch.inference_mode():
            ids = torch.tensor([sequence], dtype=torch.int64, device=device)
            logits = model(input_ids=ids, use_cache=False).logits[0, -1].float()
            top = torch.topk(logits, 2).values.tolist()
        return top[0] - top[1]
    except Exception:  # a diagnostic only: its absence is recorded as null
        return None
    finally:
        try:
            model.set_attn_implementation(previous)
        except Exception:
            pass


# ----------------------------------------------------------------------------- the manager


def api_check(model):
    """What the installed version offers: (accepts a ContinuousBatchingConfig, add_request's
    parameters)."""
    need(hasattr(model, "init_continuous_batching"), "no init_continuous_batching on the model")
    init = inspect.signature(model.init_continuous_batching).parameters
    try:
        from transformers.generation.continuous_batching import ContinuousBatchingManager
    except ImportError:
        raise BadInput(
            f"transformers {transformers_version()}: no "
            "transformers.generation.continuous_batching.ContinuousBatchingManager"
        )
    for method in ("add_request", "get_result", "start", "stop"):
        need(hasattr(ContinuousBatchingManager, method), f"no ContinuousBatchingManager.{method}")
    add = inspect.signature(ContinuousBatchingManager.add_request).parameters
    need("max_new_tokens" in add, "add_request takes no per-request max_new_tokens")
    need("eos_token_id" in add, "add_request takes no eos_token_id (to turn the EOS stop off)")
    return "continuous_batching_config" in init, add


def cb_config_for(mode, args, max_batch):
    """The ContinuousBatchingConfig of `mode`."""
    try:
        from transformers.generation import ContinuousBatchingConfig
    except ImportError:
        raise BadInput(f"transformers {transformers_version()}: no ContinuousBatchingConfig")
    fields = dict(MODES[mode][1])
    fields["max_requests_per_batch"] = max_batch
    if args.num_blocks is not None:
        fields["num_blocks"] = args.num_blocks
    if args.block_size is not None:
        fields["block_size"] = args.block_size
    if args.max_batch_tokens is not None:
        fields["max_batch_tokens"] = args.max_batch_tokens
    fields["allow_block_sharing"] = args.prefix_sharing == "on"
    known = inspect.signature(ContinuousBatchingConfig).parameters
    missing = [k for k in fields if k not in known]
    need(not missing, f"ContinuousBatchingConfig has no {', '.join(missing)}")
    return ContinuousBatchingConfig(**fields)


def resolved_settings(manager):
    """The manager's settings after it built its cache (None where the version hides one)."""
    processor = getattr(manager, "batch_processor", None)
    cache = getattr(processor, "cache", None)
    config = getattr(manager, "continuous_batching_config", None)
    get = lambda obj, name: getattr(obj, name, None) if obj is not None else None
    graphs = get(config, "use_cuda_graph")
    return {
        "block_size": get(cache, "block_size"),
        "num_blocks": get(cache, "num_blocks"),
        "max_batch_tokens": get(cache, "max_batch_tokens"),
        "max_requests_per_batch": get(config, "max_requests_per_batch"),
        "use_cuda_graph": list(graphs) if isinstance(graphs, tuple) else graphs,
        "use_async_batching": get(config, "use_async_batching"),
        "allow_block_sharing": get(config, "allow_block_sharing"),
        "prefix_sharing_in_use": get(cache, "use_prefix_sharing"),
        "cache_dtype": str(get(cache, "dtype")) if get(cache, "dtype") is not None else None,
    }


class StepSpy:
    """Counts the requests in each scheduled step by wrapping the scheduler's `schedule_batch`
    (wrapped once, whichever thread builds the batch processor); `available` false if the
    version has no such method."""

    def __init__(self, manager):
        self.sizes = []
        self.recording = False
        self.available = False
        create = getattr(manager, "_create_batch_processor", None)
        if create is None:
            return

        def hooked():
            processor = create()
            scheduler = getattr(processor, "scheduler", None)
            schedule = getattr(scheduler, "schedule_batch", None)
            if schedule is not None and not getattr(scheduler, "_hf_serve_spied", False):
                def spied(*a, **k):
                    out = schedule(*a, **k)
                    batch = out[0] if isinstance(out, tuple) else out
                    if self.recording and batch:
                        self.sizes.append(len(batch))
                    return out

                scheduler.schedule_batch = spied
                scheduler._hf_serve_spied = True
                self.available = True
            return processor

        manager._create_batch_processor = hooked


class ModeFailed(Exception):
    """A mode that could not serve the stream: recorded, then the next mode runs."""


def synthetic_prompt(length, vocab):
    return [(7919 * i + 13) % vocab for i in range(length)]


def serve_mode(model, mode, args, requests, arrivals, slo, max_batch, vocab, device, add_params):
    """Serve the stream once in `mode`: the side's figures and each request's tokens."""
    from transformers import GenerationConfig

    attn, _ = MODES[mode]
    try:
        model.set_attn_implementation(f"paged|{attn}")
    except Exception as error:
        raise ModeFailed(f"attention paged|{attn}: {type(error).__name__}: {error}")
    generation = GenerationConfig(
        do_sample=False, max_new_tokens=max(n for _, n in requests), eos_token_id=-1
    )
    cb_config = cb_config_for(mode, args, max_batch)
    manager = model.init_continuous_batching(
        generation_config=generation, continuous_batching_config=cb_config
    )
    spy = StepSpy(manager)
    if "record_timestamps" in add_params:
        ttft_source, extra = "token_timestamps", {"record_timestamps": True}
    elif "streaming" in add_params:
        ttft_source, extra = "streamed", {"streaming": True}
    else:
        ttft_source, extra = "finished", {}
    streamed = extra.get("streaming", False)

    def add(prompt, n, request_id):
        rid = manager.add_request(
            input_ids=prompt, request_id=request_id, max_new_tokens=n, eos_token_id=-1, **extra
        )
        if rid is None:
            raise ModeFailed(f"the manager refused request {request_id}")
        return rid

    def wait_all(ids, deadline, on_result):
        left = set(ids)
        while left:
            if time.perf_counter() > deadline:
                raise ModeFailed(f"timed out after {args.timeout_s} s with {len(left)} requests left")
            result = manager.get_result(timeout=0.05)
            if result is None:
                fatal = getattr(getattr(manager, "background_thread_status", None), "fatal_error", None)
                if fatal is not None or not manager.is_running():
                    raise ModeFailed(f"the generation thread stopped: {fatal!r}")
                continue
            if result.request_id not in left:
                continue
            if getattr(result, "error", None):
                raise ModeFailed(f"request {result.request_id} failed: {result.error}")
            on_result(result)
            if result.is_finished():
                left.discard(result.request_id)

    try:
        warm_start = time.perf_counter()
        if hasattr(manager, "warmup"):
            manager.warmup()
        manager.start()
        longest = max(len(p) for p, _ in requests)
        warm = [add(synthetic_prompt(longest, vocab), WARM_TOKENS, "warm_long")]
        first = synthetic_prompt(len(requests[0][0]), vocab)
        warm += [add(first, WARM_TOKENS, f"warm_{b}") for b in range(max_batch)]
        wait_all(warm, time.perf_counter() + args.timeout_s, lambda r: None)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        warm_up_s = time.perf_counter() - warm_start

        n_req = len(requests)
        outputs = [None] * n_req
        first_at = [None] * n_req
        last_at = [None] * n_req
        index = {f"r{i}": i for i in range(n_req)}
        late = 0.0

        def on_result(result):
            i = index[result.request_id]
            now = time.perf_counter()
            if first_at[i] is None and (streamed or result.is_finished()):
                first_at[i] = now
            if result.is_finished():
                outputs[i] = list(result.generated_tokens)
                last_at[i] = now
                stamps = getattr(result, "timestamps", None)
                if ttft_source == "token_timestamps":
                    if not stamps:
                        raise ModeFailed(f"request r{i} came back without time stamps")
                    first_at[i] = stamps[0]
                    last_at[i] = stamps[min(len(outputs[i]), len(stamps)) - 1]

        spy.recording = True
        t0 = time.perf_counter()
        deadline = t0 + args.timeout_s
        submitted = 0
        done = 0
        while done < n_req:
            now = time.perf_counter()
            while submitted < n_req and t0 + arrivals[submitted] <= now:
                late = max(late, now - (t0 + arrivals[submitted]))
                prompt, n = requests[submitted]
                add(prompt, n, f"r{submitted}")
                submitted += 1
            if now > deadline:
                raise ModeFailed(
                    f"timed out after {args.timeout_s} s with {n_req - done} requests left"
                )
            wait = t0 + arrivals[submitted] - time.perf_counter() if submitted < n_req else 0.05
            result = manager.get_result(timeout=min(max(wait, 0.0), 0.05))
            if result is None:
                fatal = getattr(getattr(manager, "background_thread_status", None), "fatal_error", None)
                if fatal is not None or not manager.is_running():
                    raise ModeFailed(f"the generation thread stopped: {fatal!r}")
                continue
            if result.request_id not in index:
                continue
            if getattr(result, "error", None):
                raise ModeFailed(f"request {result.request_id} failed: {result.error}")
            on_result(result)
            if result.is_finished():
                done += 1
        spy.recording = False
        settings = resolved_settings(manager)
        figures = {"attn_implementation": f"paged|{attn}", "cb_config": settings}
    finally:
        try:
            manager.stop(block=True, timeout=30)
        except Exception:
            pass
        if hasattr(manager, "destroy"):
            try:
                manager.destroy()
            except Exception:
                pass

    end = max(last_at)
    elapsed = max(end - t0, 1e-9)
    ttft_s = [first_at[i] - (t0 + arrivals[i]) for i in range(n_req)]
    tpot_s = [
        (last_at[i] - first_at[i]) / (n - 1) if n > 1 else None
        for i, (_, n) in enumerate(requests)
    ]
    ttft = [t * 1e3 for t in ttft_s]
    tpot = [t * 1e3 for t in tpot_s if t is not None]
    met, rate = serve_gpt.goodput(slo, ttft_s, tpot_s, elapsed)
    generated = sum(len(o) for o in outputs)
    sizes = spy.sizes if spy.available else None
    figures.update(
        {
            "requests_count": n_req,
            "generated_tokens": generated,
            "generated_tokens_per_s": generated / elapsed,
            "ttft_ms_p50": serve_gpt.nearest_rank(ttft, 50),
            "ttft_ms_p99": serve_gpt.nearest_rank(ttft, 99),
            "tpot_ms_p50": serve_gpt.nearest_rank(tpot, 50),
            "tpot_ms_p99": serve_gpt.nearest_rank(tpot, 99),
            "goodput_rps": rate,
            "goodput_requests": met,
            "ttft_source": ttft_source,
            "length_mismatches": sum(len(o) != n for o, (_, n) in zip(outputs, requests)),
            "submission_late_ms_max": late * 1e3,
            "in_flight_mean": sum(sizes) / len(sizes) if sizes else None,
            "in_flight_max": max(sizes) if sizes else None,
            "steps": len(sizes) if sizes is not None else None,
            "peak_allocated_bytes": (
                torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
            ),
            "peak_reserved_bytes": (
                torch.cuda.max_memory_reserved(device) if device.type == "cuda" else 0
            ),
            "warm_up_s": warm_up_s,
            "wall_s": elapsed,
        }
    )
    return figures, outputs


# ----------------------------------------------------------------------------- main


def run(args):
    if args.device:
        device = torch.device(args.device)
    else:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BadInput("--device cuda but no CUDA device")
    modes = [m for m in args.mode.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise BadInput(f"--mode takes {', '.join(MODES)}, not {unknown or args.mode!r}")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.enable_cudnn_sdp(args.cudnn_sdpa == "on")
    dtype = {"f32": torch.float32, "f16": torch.float16}[args.dtype]

    config, model = build_model(args.weights, device, dtype)
    requests, max_batch, arrivals, stream_slo = serve_gpt.read_stream(
        args.stream, config, args.max_batch
    )
    slo = serve_gpt.objective(stream_slo, args.slo_ttft_ms, args.slo_tpot_ms)
    takes_cb_config, add_params = api_check(model)
    need(takes_cb_config, "init_continuous_batching takes no continuous_batching_config")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    timing = f"arrivals over {arrivals[-1]:.2f} s" if arrivals[-1] > 0 else "all arriving at t0"
    print(
        f"device: {name}, torch {torch.__version__}, transformers {transformers_version()}, "
        f"{args.dtype}, TF32 off; GPT-2 {config}; {len(requests)} requests ({timing}), "
        f"max batch {max_batch}; modes {', '.join(modes)}"
    )
    result = {
        "device": name,
        "torch": torch.__version__,
        "transformers": transformers_version(),
        "tf32": False,
        "dtype": args.dtype,
        "cudnn_sdpa": args.cudnn_sdpa == "on",
        "model": config,
        "max_batch": max_batch,
        "arrivals": arrivals[-1] > 0,
        "slo": slo,
        "modes": modes,
        "sides": {},
    }
    outputs_of = {}
    for mode in modes:
        try:
            figures, outputs = serve_mode(
                model, mode, args, requests, arrivals, slo, max_batch, config["vocab_size"],
                device, add_params,
            )
        except BadInput:
            raise
        except Exception as error:
            # A failing mode is a result (HF's CUDA graphs crashed on GPT-2 once): record it.
            detail = traceback.format_exc().strip().splitlines()[-6:]
            text = f"{type(error).__name__}: {error}" if not isinstance(error, ModeFailed) else str(error)
            print(f"{mode:>18}: failed: {text}")
            result["sides"][mode] = {"error": text, "traceback_tail": detail}
            if device.type == "cuda":
                torch.cuda.empty_cache()
            continue
        figures["requests"] = [{"prompt": p, "output": o} for (p, _), o in zip(requests, outputs)]
        result["sides"][mode] = figures
        outputs_of[mode] = outputs
        in_flight = (
            f"in flight mean {figures['in_flight_mean']:.2f} max {figures['in_flight_max']}"
            if figures["in_flight_mean"] is not None else "in flight n/a"
        )
        line = (
            f"{mode:>18}: {figures['generated_tokens_per_s']:8.1f} tokens/s  TTFT p50/p99 "
            f"{figures['ttft_ms_p50']:.1f}/{figures['ttft_ms_p99']:.1f} ms  TPOT p50/p99 "
            f"{figures['tpot_ms_p50']:.2f}/{figures['tpot_ms_p99']:.2f} ms  {in_flight}"
        )
        if slo is not None:
            line += f"  goodput {figures['goodput_rps']:.2f} requests/s"
        if figures["length_mismatches"]:
            line += f"  ({figures['length_mismatches']} requests not of max_new_tokens tokens)"
        print(line)
    if args.check and outputs_of:
        model.set_attn_implementation("sdpa")
        gap = lambda sequence: plain_top2_gap(model, sequence, device)
        result["agreement"] = {}
        for mode, outputs in outputs_of.items():
            agreement = serve_gpt.check(args.check, requests, outputs, model, device, "hf", gap)
            result["agreement"][mode] = agreement
            for side, a in agreement.items():
                text = (
                    f"agreement {mode} vs {side}: {a['identical']}/{a['requests']} requests "
                    f"identical, {a['tokens_equal']}/{a['tokens']} tokens"
                )
                m = a["first_mismatch"]
                if m:
                    g = m["hf_top2_gap"]
                    text += (
                        f" (first mismatch: request {m['request']} token {m['index']}: ours "
                        f"{m['ours']}, hf {m['hf']}, hf top-2 gap "
                        f"{f'{g:.3g}' if g is not None else 'n/a'})"
                    )
                print(text)
    if args.json:
        try:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
        except OSError as error:
            raise BadInput(f"cannot write {args.json}: {error.strerror}")
        print(f"wrote {args.json}")
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", required=True, help="GPT-2 safetensors (HF layout)")
    parser.add_argument("--stream", required=True, help="the request stream (our example's JSON)")
    parser.add_argument("--max-batch", type=int, help="override the stream's max_batch")
    parser.add_argument("--device", choices=["cuda", "cpu"], help="default: cuda if available")
    parser.add_argument("--dtype", choices=["f32", "f16"], default="f32")
    parser.add_argument("--cudnn-sdpa", choices=["on", "off"], default="off",
                        help="SDPA's cuDNN backend (default off: a plan built per new shape)")
    parser.add_argument("--mode", default=DEFAULT_MODES, help=f"of {', '.join(MODES)}")
    parser.add_argument("--num-blocks", type=int, help="KV cache blocks (default: the library's)")
    parser.add_argument("--block-size", type=int, help="tokens per KV block (library: 256)")
    parser.add_argument("--max-batch-tokens", type=int, help="tokens per step (library's choice)")
    parser.add_argument("--prefix-sharing", choices=["on", "off"], default="on")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="per mode, warm-up apart")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--check", metavar="OURS_JSON", help="compare the tokens with ours")
    parser.add_argument("--slo-ttft-ms", type=float, help="the objective's TTFT (overrides slo)")
    parser.add_argument("--slo-tpot-ms", type=float, help="the objective's TPOT (overrides slo)")
    args = parser.parse_args(argv)
    try:
        result = run(args)
    except BadInput as error:
        print(f"{os.path.basename(sys.argv[0]) or 'hf_serve.py'}: error: {error}", file=sys.stderr)
        sys.exit(2)
    if all("error" in side for side in result["sides"].values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
