#!/usr/bin/env bash
# Usage: [PYTHON=python] [ZCC_ROOT=dir] ladder.sh
#
# Replays the obstacle ladder: rung L0 runs with the project's Trainer shims only, each later rung adds the shims
# that get past the previous rung's obstacle, L5 runs with all of them. For each rung it prints the run's status,
# the first error in rank 0's log (the rank's or its ZCC worker's) and how many wait-loop lines ZCC's manager
# logged (a rank whose worker died loops there until the timeout: 60 s per such rung, about 4 min in all).
set -u
here="$(cd "$(dirname "$0")" && pwd)"
export ZCC_ROOT="${ZCC_ROOT:-$(mktemp -d -t zcc-cpu.XXXXXX)}"
echo "ZCC_ROOT=$ZCC_ROOT"
rung() {  # name timeout shims
    T="$2" bash "$here/run.sh" "$1" ZCC_SHIMS="$3" | head -1 | sed "s/^/$1: /"
    log="$ZCC_ROOT/logs/$1/workerlog.0"
    echo "  first error: $(grep -m1 -E "^[A-Za-z.]*(Error|Exception)|failed!!, Exception" "$log" \
        | sed -E 's/^.*(\[ZCC Worker[0-9]+\] failed)/\1/' | cut -c1-200)"
    echo "  manager wait-loop lines: $(grep -c "waiting worker0 update\|Waiting current worker offloading done" "$log")"
}
p=base,adamw-inplace
rung L0 120 "$p"
rung L1 120 "$p,fusion-device-cpu"
rung L2 60 "$p,fusion-device-cpu,gloo-reduce-scatter"
rung L3 60 "$p,fusion-device-cpu,gloo-reduce-scatter,worker-device,worker-entry"
rung L4 60 "$p,fusion-device-cpu,gloo-reduce-scatter,worker-device,worker-entry,async-load"
rung L5 120 all
