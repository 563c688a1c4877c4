#!/bin/sh
# One device call that measures the products the open issues turn on, PyTorch in the same call,
# with the SM clock logged beside every run. Run there from the repository root, after
# `../shared/gpu/prepare --example bench_kernels` here, carrying `.gpu`:
#
#     sh benches/gpu/kernels_call.sh
#
# - GPT-2's decode products at 1 to 16 rows, f32, automatic plans (tuned) beside PyTorch
#   (issue 27: the 16-row products are most of a planned decode step), then at 16 rows with the
#   narrow kernel's groups of rows forced to 1, 2 and 4 (4 and 8 lanes, unsplit).
# - f16 products on cooperative matrices (issue 28): the serving shapes with every named tile
#   forced (the slabs of 32 and of 64 of K), beside PyTorch half.
#
# An idle CUDA context is held for the whole call (benches/gpu/watch.sh; `HOLD=0` leaves it out):
# with it the SM clock stayed at 1,980 MHz under bursty Vulkan work (call 59).
#
# Writes $OUT/kernels.tgz (the device tool brings back only a few files): clocks.csv (timestamp,
# SM clock every 250 ms), started.txt (each run's start, UTC), torch32/torch16.json (PyTorch),
# decode.{json,txt}, groupsG.{json,txt}, coop.{json,txt}.
. benches/gpu/watch.sh
DECODE=""
for m in 1 4 8 16; do
    for nk in 2304x768 768x768 3072x768 768x3072; do
        DECODE="$DECODE --matmul ${m}x$nk"
    done
done
DECODE="$DECODE --matmul 16x50260x768"
SHAPES=$(echo "$DECODE" | sed 's/--matmul/--shape/g')
mark torch32
# shellcheck disable=SC2086 # lists of arguments
python3 benches/torch/matmul.py $SHAPES --json "$W/torch32.json" > "$W/torch32.txt" 2>&1
mark decode
# shellcheck disable=SC2086
sh .gpu/run bench_kernels --only matmul $DECODE --torch "$W/torch32.json" \
    --json "$W/decode.json" > "$W/decode.txt" 2>&1
for g in 1 2 4; do
    mark "groups$g"
    sh .gpu/run bench_kernels --only matmul --matmul 16x2304x768 --matmul 16x3072x768 \
        --matmul 16x768x3072 --matmul 16x768x768 --narrow-row-groups "$g" --narrow-lanes 4 \
        --narrow-lanes 8 --narrow-splits 1 --json "$W/groups$g.json" > "$W/groups$g.txt" 2>&1
done
mark torch16
python3 benches/torch/matmul.py --serving --dtype half --json "$W/torch16.json" \
    > "$W/torch16.txt" 2>&1
TILES=""
for t in 128x128 128x256 64x128 64x64 32x128 128x128x64 128x128x64w 64x128x64; do
    TILES="$TILES --coop-tile $t"
done
mark coop
# shellcheck disable=SC2086
sh .gpu/run bench_kernels --serving --only matmul --dtype f16 --cooperative-matrix --no-autotune \
    $TILES --torch "$W/torch16.json" --json "$W/coop.json" > "$W/coop.txt" 2>&1
mark done
finish kernels.tgz
tail -n 40 "$W/coop.txt"
