# Sourced by the device-call scripts of this folder (`. benches/gpu/watch.sh`): a work folder $W,
# the SM clock logged into $W/clocks.csv every 250 ms, an idle CUDA context held for the whole
# call (`HOLD=0` leaves it out: with one held, the H100's clock stayed at 1,980 MHz between runs,
# call 59 against calls 60 and 62 in MEASUREMENTS.md), `mark NAME` writing each run's start
# (UTC) into $W/started.txt, and `finish ARCHIVE` stopping both and packing $W into
# $OUT/ARCHIVE (the device tool brings back only a few files).
set -u
: "${OUT:?OUT must name the folder whose files come back}"
W=$(mktemp -d)
nvidia-smi --query-gpu=timestamp,clocks.sm --format=csv -lms 250 > "$W/clocks.csv" 2>&1 &
clock=$!
hold=""
if [ "${HOLD:-1}" = 1 ]; then
    python3 -c "import torch, time; torch.ones(1, device='cuda').sum().item(); time.sleep(3600)" &
    hold=$!
fi
mark() { echo "$1 $(date -u +%H:%M:%S.%N)" >> "$W/started.txt"; }
finish() {
    kill "$clock"
    [ -n "$hold" ] && kill "$hold"
    tar czf "$OUT/$1" -C "$W" .
}
