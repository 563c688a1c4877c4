#!/bin/sh
# One device call that measures GPT-2 serving on the lent GPU (issue 27), PyTorch in the same
# call, with the SM clock logged beside every run. Run there from the repository root, after
# `../shared/gpu/prepare --example serve_gpt --test it` here, carrying `.gpu`:
#
#     sh benches/gpu/serve_call.sh
#
# Writes $OUT/serve.tgz (the device tool brings back only a few files), holding: clocks.csv
# (timestamp, SM clock every 250 ms), sides1..N.{json,txt} (paged, paged_sync and paged_eager: the
# planned/eager decode-step ratio, N times), eager.{json,txt} (the three memory sides and the eager
# ones), torch.{json,txt} (PyTorch on eager.json's stream, its tokens checked against ours),
# it.txt (the integration tests; `layering` reads src/, which is not carried), and started.txt
# (each run's start, UTC, to place it in clocks.csv). Every side's JSON also has `span_unix_s`.
# `RUNS=N` serves the sides N times (default 2); `TESTS=0` leaves the integration tests out.
. benches/gpu/watch.sh
mark weights
sh .gpu/run serve_gpt --model gpt2 --write-weights /tmp/gpt2.safetensors > "$W/weights.txt" 2>&1
S="--model gpt2 --weights /tmp/gpt2.safetensors --requests 64 --max-batch 16 --seed 1"
for i in $(seq "${RUNS:-2}"); do
    mark "sides$i"
    # shellcheck disable=SC2086 # $S is a list of arguments
    sh .gpu/run serve_gpt $S --warm-s 2 --sides paged,paged_sync,paged_eager \
        --json "$W/sides$i.json" > "$W/sides$i.txt" 2>&1
done
mark eager
# shellcheck disable=SC2086
sh .gpu/run serve_gpt $S --warm-s 2 --eager --json "$W/eager.json" > "$W/eager.txt" 2>&1
mark torch
python3 benches/torch/serve_gpt.py --weights /tmp/gpt2.safetensors --stream "$W/eager.json" \
    --json "$W/torch.json" --check "$W/eager.json" > "$W/torch.txt" 2>&1
if [ "${TESTS:-1}" != 0 ]; then
    mark it
    sh .gpu/run it --skip layering > "$W/it.txt" 2>&1
fi
mark done
finish serve.tgz
[ -f "$W/it.txt" ] && grep -h "test result" "$W/it.txt"
tail -n 3 "$W/torch.txt"
