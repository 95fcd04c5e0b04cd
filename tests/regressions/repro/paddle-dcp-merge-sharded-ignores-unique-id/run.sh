#!/usr/bin/env bash
# Runs repro.py: each launch below starts fresh processes on the same checkpoint directory.
# CPU shims: on a CPU-only Paddle wheel repro.py turns Tensor.cuda() and Tensor.pin_memory() into CPU copies
# and device.synchronize() into a no-op, because the checkpoint code calls them on the paths the bug needs.
# Exit status: 0 when no step shows the bug; 1 (or the failing launch's status) while it is there;
# 124 when a launch hangs (bounded at 300 s).
set -u
cd "$(dirname "$0")"
# bash run.sh --with-fix: the same, with the candidate fix (fix.py; fix.diff as a patch) applied.
if [ "${1:-}" = "--with-fix" ]; then  # the candidate fix (fix.py) in every process: then it exits 0
  export REPRO_WITH_FIX=1
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export TMPDIR="$WORK"  # temporary files of the launchers and frameworks go with it

launch() {  # launch PHASE NPROC
  if [ "$2" -eq 1 ]; then
    timeout -k 10 300 python repro.py "$WORK/ckpt" "$1"
    return $?
  fi
  timeout -k 10 300 python -m paddle.distributed.launch --nproc_per_node "$2" --log_dir "$WORK/log$1" repro.py "$WORK/ckpt" "$1" > "$WORK/launch$1.out" 2>&1
  local status=$?
  for log in "$WORK/log$1"/workerlog.*; do echo "== $log"; grep -v "\] \[ *INFO\]" "$log"; done
  [ $status -eq 124 ] && echo "BUG: launch $1 did not finish within the bound: a hang"
  return $status
}

launch 0 2 || exit $?
