#!/bin/sh
# One device call for issue 44: GPT-2 small's decode step, ours beside PyTorch eager, PyTorch with
# CUDA graphs and Hugging Face's continuous batching, in f32 and f16, each side's tokens
# teacher-forced against a float64 forward. Run there from the repository root, after
# `../shared/gpu/prepare --example serve_gpt` here, carrying `.gpu`:
#
#     sh benches/gpu/decode_call.sh
#
# The weights: `serve_gpt --model gpt2 --write-weights` (seeded random GPT-2 small, f32). For
# each max batch B in BATCHES (default "16 64") and dtype D in DTYPES (default "f32 f16"), on the
# default stream of 4·B requests (64 at B = 16, as the serving calls before; 256 at B = 64, so
# that 64 are in flight), all at t0, `--seed 1`:
#
# - ours_D_B: `serve_gpt --sides paged --max-batch B --dtype D --warm-s 2` (planned, pipelined
#   steps), which writes the stream;
# - eager_D_B: `benches/torch/serve_gpt.py --dtype D --mode eager` on that stream, its tokens
#   checked against ours (`--check`), and ours and its own tokens teacher-forced against float64
#   (`--teacher-force`: at every generated position the float64 argmax after the side's own
#   prefix against the side's token; a disagreement within a logit gap of 1e-2 is a near-tie);
# - graphs_D_B: the same with `--mode graphs` (a CUDA graph per batch size 1..B, captured in the
#   untimed warm-up; attention over the whole static cache), checked against ours;
# - at B = 16 and f16 only, hf_f16_16: `benches/torch/hf_serve.py --dtype f16 --mode paged_sdpa`
#   (HF_MODE), checked against ours, and tf_hf_f16_16 its tokens teacher-forced
#   (`serve_gpt.py --teacher-force hf_f16_16.json --side paged_sdpa`).
#
# PyTorch and HF run with SDPA's cuDNN backend off (their default `--cudnn-sdpa off`: in f16 it
# builds a plan for every new shape, 45-60 ms each on an H100, measured with PyTorch 2.11).
#
# Then profile_D for each D: `serve_gpt --sides paged --profile --requests 32 --max-batch 16
# --dtype D` (the side `paged_profile` runs eagerly with GPU timestamps around every dispatch:
# GPU time per kernel over the decode-only steps).
#
# Time: about 6–8 minutes on an H100 (each of ours about 15–25 s, each PyTorch run about 20–35 s
# with its warm-up, capture and the float64 forwards, HF about 40–60 s); the call's limit is 10.
# Every run is bounded by `timeout` (cut to what is left of LIMIT_S + 40 s), and a run is skipped
# (its skip written in skipped.txt) once the call has used LIMIT_S seconds (default 540) less its
# estimate; the order is B = 16 first, then 64, then the profiles. A failing run is recorded (its
# text and its exit status at the end of its .txt) and the call goes on; the PyTorch runs of a
# stream need ours' JSON.
#
# Writes $OUT/decode.tgz, holding: clocks.csv (timestamp, SM clock every 250 ms), started.txt
# (each run's start, UTC), weights.txt, for each D and B ours_D_B, eager_D_B, graphs_D_B (.json,
# .txt), hf_f16_16 and tf_hf_f16_16 (.json, .txt), profile_D (.json, .txt), skipped.txt, and
# summary.txt, the table printed at the end: per batch and dtype, each side's tokens/s, decode
# step ms (ours: `decode_step_ms_mean`, a pipelined step's host time; PyTorch: the host time of a
# step from its inputs to its tokens on the host; HF gives none), TPOT p50, tokens equal to ours,
# and teacher forcing against float64 (requests equal up to a near-tie, tokens equal, near-ties,
# unexplained); whether graph mode's tokens equal eager mode's; the ratios ours/graphs and
# ours/eager of tokens/s and of the decode step; then the profiles' heaviest kernels.
. benches/gpu/watch.sh
START=$(date +%s)
LIMIT=${LIMIT_S:-540}
BATCHES=${BATCHES:-"16 64"}
DTYPES=${DTYPES:-"f32 f16"}
HF_MODE=${HF_MODE:-paged_sdpa}
: > "$W/skipped.txt"
# `fits SECONDS NAME`: true if a run of about SECONDS still fits in the call.
fits() {
    if [ $(($(date +%s) - START + $1)) -le "$LIMIT" ]; then return 0; fi
    echo "$2: skipped at $(($(date +%s) - START)) s (estimate $1 s, limit $LIMIT s)" \
        | tee -a "$W/skipped.txt"
    return 1
}
# `cap SECONDS`: SECONDS, or less where the call's time (LIMIT_S plus 40 s) would run out first.
cap() {
    room=$((LIMIT + 40 - ($(date +%s) - START)))
    if [ "$1" -lt "$room" ]; then echo "$1"; else echo $((room > 1 ? room : 1)); fi
}
# `record NAME`: the last command's exit status, at the end of NAME.txt.
record() {
    echo "exit $?" >> "$W/$1.txt"
}
mark weights
sh .gpu/run serve_gpt --model gpt2 --write-weights /tmp/gpt2.safetensors > "$W/weights.txt" 2>&1
record weights
G="--model gpt2 --weights /tmp/gpt2.safetensors --seed 1 --warm-s 2"
TORCH="benches/torch/serve_gpt.py --weights /tmp/gpt2.safetensors"

for batch in $BATCHES; do
    for dtype in $DTYPES; do
        tag="${dtype}_$batch"
        fits 25 "ours_$tag" || continue
        mark "ours_$tag"
        # shellcheck disable=SC2086 # $G is a list of arguments
        timeout "$(cap 90)" sh .gpu/run serve_gpt $G --sides paged --max-batch "$batch" \
            --requests $((4 * batch)) --dtype "$dtype" --json "$W/ours_$tag.json" \
            > "$W/ours_$tag.txt" 2>&1
        record "ours_$tag"
        [ -f "$W/ours_$tag.json" ] || continue
        if fits 35 "eager_$tag"; then
            mark "eager_$tag"
            # shellcheck disable=SC2086 # $TORCH is the script and its weights
            timeout "$(cap 150)" python3 $TORCH --stream "$W/ours_$tag.json" \
                --check "$W/ours_$tag.json" --teacher-force "$W/ours_$tag.json" \
                --dtype "$dtype" --mode eager --json "$W/eager_$tag.json" \
                > "$W/eager_$tag.txt" 2>&1
            record "eager_$tag"
        fi
        if fits 30 "graphs_$tag"; then
            mark "graphs_$tag"
            # shellcheck disable=SC2086
            timeout "$(cap 150)" python3 $TORCH --stream "$W/ours_$tag.json" \
                --check "$W/ours_$tag.json" --dtype "$dtype" --mode graphs \
                --json "$W/graphs_$tag.json" > "$W/graphs_$tag.txt" 2>&1
            record "graphs_$tag"
        fi
        if [ "$batch" = 16 ] && [ "$dtype" = f16 ] && fits 60 "hf_$tag"; then
            mark "hf_$tag"
            timeout "$(cap 180)" python3 benches/torch/hf_serve.py --weights /tmp/gpt2.safetensors \
                --stream "$W/ours_$tag.json" --check "$W/ours_$tag.json" --dtype f16 \
                --mode "$HF_MODE" --timeout-s 120 --json "$W/hf_$tag.json" > "$W/hf_$tag.txt" 2>&1
            record "hf_$tag"
            if [ -f "$W/hf_$tag.json" ] && fits 25 "tf_hf_$tag"; then
                mark "tf_hf_$tag"
                # shellcheck disable=SC2086
                timeout "$(cap 90)" python3 $TORCH --teacher-force "$W/hf_$tag.json" \
                    --side "$HF_MODE" --json "$W/tf_hf_$tag.json" > "$W/tf_hf_$tag.txt" 2>&1
                record "tf_hf_$tag"
            fi
        fi
    done
done
for dtype in $DTYPES; do
    fits 35 "profile_$dtype" || continue
    mark "profile_$dtype"
    # shellcheck disable=SC2086
    timeout "$(cap 120)" sh .gpu/run serve_gpt $G --sides paged --profile --requests 32 \
        --max-batch 16 --dtype "$dtype" --json "$W/profile_$dtype.json" \
        > "$W/profile_$dtype.txt" 2>&1
    record "profile_$dtype"
done
mark done
python3 - "$W" "$BATCHES" "$DTYPES" "$HF_MODE" > "$W/summary.txt" 2>&1 <<'EOF'
import json, os, re, sys

w, batches, dtypes, hf_mode = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), sys.argv[4]


def load(name):
    try:
        with open(os.path.join(w, name)) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return None


def why(name):
    """A run without a result: the last lines of its text (its error and exit status)."""
    try:
        with open(os.path.join(w, name + ".txt")) as f:
            lines = [line.strip() for line in f if line.strip()]
    except OSError:
        return "not run"
    if not lines:
        return "no output"
    if lines[-1].startswith("exit") and len(lines) > 1:
        return f"{lines[-1]}: {lines[-2]}"
    return lines[-1]


def fmt(value, spec):
    if isinstance(value, (int, float)):
        return format(value, spec)
    return "-".rjust(int(re.match(r"\d*", spec).group() or 0))


def forcing(t):
    """Teacher forcing: requests equal up to a near-tie, tokens equal, near-ties, unexplained."""
    if not t:
        return "-"
    return (f"{t['equal_until_near_tie']}/{t['requests']} req "
            f"({t['equal_until_near_tie_rate']:.3f}), {t['equal']}/{t['tokens']} tok, "
            f"{t['near_ties']} near-ties, {t['unexplained']} unexplained")


def row(label, dtype, batch, run, side, agreement=None, forced=None):
    if side is None or "error" in side:
        error = (side or {}).get("error") or why(run)
        print(f"  {label:<18} {dtype:<6} {batch:>5}  failed: {str(error)[:110]}")
        return None
    agree = "-"
    if agreement:
        agree = (f"{agreement['tokens_equal']}/{agreement['tokens']} "
                 f"({agreement['identical']}/{agreement['requests']} req)")
    print(f"  {label:<18} {dtype:<6} {batch:>5} {fmt(side.get('generated_tokens_per_s'), '10.1f')}"
          f" {fmt(side.get('decode_step_ms_mean'), '9.3f')} {fmt(side.get('tpot_ms_p50'), '8.3f')}"
          f"  {agree:<22} {forcing(forced)}")
    return side


print("decode (issue 44): GPT-2 small, the default stream; ms; tokens equal to ours (requests "
      "identical);")
print("teacher forcing against float64: requests equal up to a near-tie (rate), tokens equal, "
      "near-ties, unexplained")
print(f"  {'side':<18} {'dtype':<6} {'batch':>5} {'tokens/s':>10} {'step ms':>9} {'TPOT p50':>8}"
      f"  {'equal to ours':<22} teacher forcing")
ratios, gaps = [], set()
for batch in batches:
    for dtype in dtypes:
        tag = f"{dtype}_{batch}"
        ours_doc = load(f"ours_{tag}.json") or {}
        recorded = ours_doc.get("dtype")
        label = dtype if recorded in (None, dtype) else f"{dtype}(JSON {recorded})"
        eager_doc = load(f"eager_{tag}.json") or {}
        graphs_doc = load(f"graphs_{tag}.json") or {}
        tf = eager_doc.get("teacher_forcing") or {}
        ours = row("ours paged", label, batch, f"ours_{tag}",
                   (ours_doc.get("sides") or {}).get("paged"), None, tf.get("ours"))
        eager = row("pytorch eager", eager_doc.get("dtype", dtype), batch, f"eager_{tag}",
                    eager_doc.get("side"), (eager_doc.get("agreement") or {}).get("paged"),
                    tf.get("torch"))
        graphs = row("pytorch graphs", graphs_doc.get("dtype", dtype), batch, f"graphs_{tag}",
                     graphs_doc.get("side"), (graphs_doc.get("agreement") or {}).get("paged"))
        if os.path.exists(os.path.join(w, f"hf_{tag}.txt")):
            hf_doc = load(f"hf_{tag}.json") or {}
            tf_hf = (load(f"tf_hf_{tag}.json") or {}).get("teacher_forcing") or {}
            agreement = ((hf_doc.get("agreement") or {}).get(hf_mode) or {}).get("paged")
            row(f"hf {hf_mode}", hf_doc.get("dtype", dtype), batch, f"hf_{tag}",
                (hf_doc.get("sides") or {}).get(hf_mode), agreement, tf_hf.get("ours"))
            gaps.add((tf_hf.get("ours") or {}).get("near_tie_gap"))
        if ours:
            steps = ours.get("plan_steps") or {}
            decode = {k: v for k, v in steps.items() if k.endswith("decode")}
            print(f"  {'':<18} dispatches a planned step: decode-only {json.dumps(decode)}, "
                  f"of any rows at {batch}: {steps.get(f'{batch} any', '-')}; in flight "
                  f"{fmt(ours.get('in_flight_mean'), '.2f')} (max {ours.get('in_flight_max')}), "
                  f"capacity at n_ctx {ours.get('capacity_at_max_length')}, "
                  f"KV blocks {ours.get('kv_blocks')}")
        if eager and graphs:
            e = [r["output"] for r in eager["requests"]]
            g = [r["output"] for r in graphs["requests"]]
            same = sum(a == b for a, b in zip(e, g))
            tokens = sum(a == b for x, y in zip(e, g) for a, b in zip(x, y))
            print(f"  {'':<18} graph mode's tokens equal eager mode's: {same}/{len(e)} requests, "
                  f"{tokens}/{sum(map(len, e))} tokens")
        gaps.update(t.get("near_tie_gap") for t in tf.values() if isinstance(t, dict))
        ratios.append((tag, ours, eager, graphs))
gaps.discard(None)
print(f"near-tie gap: {', '.join(f'{g:g}' for g in sorted(gaps)) or '-'}")
print()
print("ratios (ours / peer: tokens/s; peer / ours: decode step ms)")
for tag, ours, eager, graphs in ratios:
    for name, peer in (("graphs", graphs), ("eager", eager)):
        if not ours or not peer:
            print(f"  {tag:<8} ours/{name:<6} -")
            continue
        speed = ours["generated_tokens_per_s"] / max(peer["generated_tokens_per_s"], 1e-9)
        step = "-"
        if ours.get("decode_step_ms_mean") and peer.get("decode_step_ms_mean"):
            step = f"{peer['decode_step_ms_mean'] / ours['decode_step_ms_mean']:.2f}x"
        print(f"  {tag:<8} ours/{name:<6} tokens/s {speed:.2f}x, decode step {step}")
print()
print("profiles (ours, --profile, 32 requests, max batch 16): GPU time per kernel over the "
      "decode-only steps")
for dtype in dtypes:
    doc = load(f"profile_{dtype}.json") or {}
    sides = doc.get("sides") or {}
    paged, profiled = sides.get("paged") or {}, sides.get("paged_profile") or {}
    kernels = (profiled.get("profile") or {}).get("decode_steps")
    if not kernels:
        print(f"  {dtype}: no profile ({profiled.get('error') or why(f'profile_{dtype}')})")
        continue
    steps = max(profiled.get("decode_steps") or 1, 1)
    total = sum(k["gpu_us_per_step"] for k in kernels)
    print(f"  {dtype}: paged {fmt(paged.get('generated_tokens_per_s'), '.1f')} tokens/s, "
          f"decode step {fmt(paged.get('decode_step_ms_mean'), '.3f')} ms; profiled: {steps} "
          f"decode-only steps, {total:.1f} µs of kernels a step")
    for k in kernels[:10]:
        per_step = k["dispatches"] / steps
        print(f"    {k['gpu_us_per_step']:9.1f} µs {per_step:6.1f} dispatches a step  {k['kernel']}")
EOF
finish decode.tgz
cat "$W/summary.txt"
cat "$W/skipped.txt"
