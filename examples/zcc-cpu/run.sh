#!/usr/bin/env bash
# Usage: [PYTHON=python] [ZCC_ROOT=dir] [T=300] run.sh NAME [VAR=VALUE ...]
#
# Launches probe.py on 2 CPU ranks (paddle.distributed.launch over gloo) with the VAR=VALUE settings (the probe's
# knobs, see probe.py) in its environment, bounded by `timeout $T`. Writes the probe's output to
# $ZCC_ROOT/out/NAME and the launcher's logs to $ZCC_ROOT/logs/NAME (a rerun of NAME replaces both); ZCC_ROOT
# defaults to a fresh `mktemp -d`, so set it to keep several runs side by side (a resume reads an earlier run's
# output). Afterwards it kills whatever the run left behind (ZCC workers re-parent to init when their rank dies,
# and carry the run's token in their environment) and removes the run's /dev/shm segments, then prints rank 0's
# probe lines. Exit status: the launcher's (124 when the timeout ended it).
set -u
if [ $# -lt 1 ] || [ "${1#-}" != "$1" ]; then
    sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
name="$1"; shift
here="$(cd "$(dirname "$0")" && pwd)"
py="${PYTHON:-python}"
root="${ZCC_ROOT:-$(mktemp -d -t zcc-cpu.XXXXXX)}"
mkdir -p "$root"
root="$(cd "$root" && pwd)"
out="$root/out/$name"
logs="$root/logs/$name"
rm -rf "$out" "$logs"
mkdir -p "$out" "$root/logs"
token="zcc-cpu-$name-$$-$RANDOM"
port="$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')" || exit 2

start=$(date +%s.%N)
env PYTHONDONTWRITEBYTECODE=1 ZCC_PROBE_TOKEN="$token" ZCC_OUT="$out" "$@" \
    timeout -k 10 "${T:-300}" "$py" -m paddle.distributed.launch --nproc_per_node 2 --master "127.0.0.1:$port" \
    --log_dir "$logs" "$here/probe.py" > "$logs.launch.txt" 2>&1
rc=$?
end=$(date +%s.%N)

# Leftovers carry the token in their environment: kill them by pid, then let init reap them.
left=""
for environ in $(grep -lzxF "ZCC_PROBE_TOKEN=$token" /proc/[0-9]*/environ 2>/dev/null); do
    pid="${environ#/proc/}"; pid="${pid%/environ}"
    [ "$pid" = "$$" ] && continue
    echo "leftover pid $pid: $( (tr '\0' ' ' < "/proc/$pid/cmdline") 2>/dev/null | cut -c1-120)"
    kill -9 "$pid" 2>/dev/null
    left="$left $pid"
done
for pid in $left; do
    for _ in 1 2 3 4 5 6 7 8 9 10; do [ -d "/proc/$pid" ] || break; sleep 0.2; done
done

# The ipc-shm shim's segments are named /dev/shm/paddle_<pid>_...; a rank that was killed or timed out never
# frees them. The pids: the probe's and the workers' pid lines, and the IPC metas ZCC logs.
pids="$(cat "$logs"/workerlog.* 2>/dev/null \
    | grep -oE "\[(probe rank[0-9]+|zcc-cpu worker)\] pid=[0-9]+|'/paddle_[0-9]+_" | grep -oE "[0-9]+_?$" \
    | tr -d _ | sort -u)"
for pid in $pids; do
    [ -d "/proc/$pid" ] || rm -f /dev/shm/paddle_"${pid}"_*
done

echo "rc=$rc wall=$(awk "BEGIN { printf \"%.1f\", $end - $start }") s"
echo "output: $out"
echo "logs:   $logs (workerlog.0, workerlog.1; the launcher's in $logs.launch.txt)"
grep -h "^\[probe rank0\]" "$logs/workerlog.0" 2>/dev/null | cut -c1-400
exit "$rc"
