#!/bin/sh
# One device call that compares two builds of `serve_gpt` on the same stream: each profiled
# (`--sides paged --profile`: the planned side's tokens/s and decode step, and the eager side's
# GPU time per kernel) twice, alternating base, change, base, change, with the SM clock logged
# beside them; then PyTorch on the change's stream, its tokens checked against the change's.
# Here: build the base (e.g. main) with `../shared/gpu/prepare --example serve_gpt` and keep
# `.gpu/bin/serve_gpt` aside; check out the change, prepare again, and copy the kept binary to
# `.gpu/bin/serve_gpt_base`. Then there, carrying `.gpu`:
#
#     sh benches/gpu/ab_call.sh
#
# With `SIDES=1`, each build then also serves the stream as `--sides paged,paged_sync,paged_eager`
# (the planned/eager decode-step ratio of issue 27), base and change alternating once more.
#
# Writes $OUT/ab.tgz: clocks.csv, started.txt (each run's start, UTC), and per run
# {base,change}{1,2}.{json,txt}, torch.{json,txt} and with SIDES=1 {base,change}_sides.{json,txt}.
if [ ! -x .gpu/bin/serve_gpt_base ]; then
    echo "no .gpu/bin/serve_gpt_base (the build to compare with)"
    exit 2
fi
. benches/gpu/watch.sh
# The binary of build $1 (base or change).
binary() {
    if [ "$1" = base ]; then echo serve_gpt_base; else echo serve_gpt; fi
}
sh .gpu/run serve_gpt --model gpt2 --write-weights /tmp/gpt2.safetensors > "$W/weights.txt" 2>&1
S="--model gpt2 --weights /tmp/gpt2.safetensors --requests 64 --max-batch 16 --seed 1"
for i in 1 2; do
    for side in base change; do
        mark "$side$i"
        # shellcheck disable=SC2086 # $S is a list of arguments
        sh .gpu/run "$(binary "$side")" $S --warm-s 2 --sides paged --profile \
            --json "$W/$side$i.json" > "$W/$side$i.txt" 2>&1
    done
done
if [ "${SIDES:-0}" = 1 ]; then
    for side in base change; do
        mark "${side}_sides"
        # shellcheck disable=SC2086 # $S is a list of arguments
        sh .gpu/run "$(binary "$side")" $S --warm-s 2 --sides paged,paged_sync,paged_eager \
            --json "$W/${side}_sides.json" > "$W/${side}_sides.txt" 2>&1
    done
fi
mark torch
python3 benches/torch/serve_gpt.py --weights /tmp/gpt2.safetensors --stream "$W/change1.json" \
    --json "$W/torch.json" --check "$W/change1.json" > "$W/torch.txt" 2>&1
mark done
finish ab.tgz
for f in base1 change1 base2 change2; do
    echo "== $f"
    grep -h "tokens/s\|kernels a step" "$W/$f.txt" | head -3
    grep -h -m 3 "paged_attention\|kv_write\|layer_norm" "$W/$f.txt"
done
for f in base_sides change_sides; do
    [ -f "$W/$f.txt" ] && echo "== $f" && grep -h "tokens/s\|decode step" "$W/$f.txt" | head -8
done
tail -n 1 "$W/torch.txt"
