#!/usr/bin/env bash
# Several GPU jobs side by side on one multi-GPU host, each on its own cards and under its own time
# limit. The machine is set up once per commit (a fresh clone of .carry/repo.bundle at
# .carry/commit, then `gpu_session.sh setup`); a later call on the same warm machine reuses it, and
# suites that write under /tmp resume there (`stitchcuda bench --out` skips what is done); on a fresh
# machine they resume from the results folders carried in .carry/results/b_*.
#
#   JOBS="zoo perf" GPUS_zoo=0,1 GPUS_perf=2,3 LIM=480 LIM_perf=400 \
#   CMD_zoo="stitchcuda bench models/zoo --precision tf32 --gpus 2 --out /tmp/b_zoo" \
#   CMD_perf="..." OUT=/tmp/out bash benchmarks/gpu_jobs.sh
#
# A job runs in the clone's root in a process group of its own, and the whole group is ended at its
# limit. Back under $OUT: setup.log, jobs.txt (each job's exit status and seconds) and res.tgz
# (every job's log, and the small files of every /tmp/b_* results folder: results, reports).
set -u -o pipefail
OUT=${OUT:?OUT names the folder that comes back}
SRC=$PWD
REPO=${REPO:-/tmp/repo}
want=$(cat .carry/commit)
if [ "$(cat /tmp/setup.commit 2>/dev/null)" != "$want" ]; then
  rm -rf "$REPO"
  git clone -q .carry/repo.bundle "$REPO" && git -C "$REPO" checkout -q --detach "$want" || exit 1
  for d in .carry .whl shared; do [ -d "$SRC/$d" ] && cp -r "$SRC/$d" "$REPO/"; done
  (cd "$REPO" && OUT=/tmp/logs bash benchmarks/gpu_session.sh setup) > "$OUT/setup.log" 2>&1 \
    || { tail -30 "$OUT/setup.log"; exit 1; }
  echo "$want" > /tmp/setup.commit
fi
# results of an earlier machine, carried back in .carry/results/b_*: the suites resume from them
[ -d "$SRC/.carry/results" ] && cp -rn "$SRC/.carry/results/." /tmp/
cd "$REPO" || exit 1
source benchmarks/gpu_env.sh
mkdir -p /tmp/logs
echo "commit $want, $(date -u +%FT%TZ), $(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | xargs)" \
  >> "$OUT/jobs.txt"

run_job() {  # name: CMD_<name> on GPUS_<name> for at most LIM_<name> (or LIM) seconds
  local j=$1 g c l pid wd rc t0
  g=GPUS_$j; c=CMD_$j; l=LIM_$j
  t0=$(date +%s)
  CUDA_VISIBLE_DEVICES=${!g:-0} setsid bash -c "${!c}" > "/tmp/logs/$j.log" 2>&1 &
  pid=$!
  echo "$pid" >> /tmp/logs/.groups
  # the watchdog in a process group of its own, its output away from ours: ended with its group when
  # the job ends first, so that no sleeping child of it holds the caller's pipe (and the machine)
  # open until the limit
  setsid bash -c "sleep ${!l:-${LIM:-480}}; kill -TERM -- -$pid 2>/dev/null; sleep 15; kill -KILL -- -$pid 2>/dev/null" \
    > /dev/null 2>&1 < /dev/null &
  wd=$!
  wait "$pid"; rc=$?
  kill -- "-$wd" 2>/dev/null
  echo "$j: exit $rc in $(( $(date +%s) - t0 )) s — $(tail -1 "/tmp/logs/$j.log" | cut -c1-200)" >> "$OUT/jobs.txt"
}

small_files() {  # (in /tmp) every job's log and the small files of every b_* results folder
  find logs b_* -maxdepth 3 -type f -size -4M \
    \( -name '*.log' -o -name '*.jsonl' -o -name '*.json' -o -name '*.md' -o -name '*.txt' -o -name '*.svg' -o -name '*.csv' \) \
    2>/dev/null
}
run_records() {  # (in /tmp) an optimize run's own record, which results.jsonl only summarises:
  # b_*/problems/<name>/run/ run.json (without it a later machine cannot resume the run), report.md,
  # state.json, events.jsonl, each candidate's candidate.json and the Verifier's report.json
  find b_* -mindepth 4 -maxdepth 8 -type f -size -1024k \( -name run.json -o -name report.md -o -name state.json \
    -o -name events.jsonl -o -name candidate.json -o -name report.json \) 2>/dev/null
}
pack() {  # both into $OUT/res.tgz; a file comes back only under 16 MiB, so past 15 MiB the small files alone
  (cd /tmp && { small_files; run_records; } > "/tmp/.pack.$BASHPID"
   tar czf "$OUT/res.tgz.part" -T "/tmp/.pack.$BASHPID"
   if [ "$(stat -c %s "$OUT/res.tgz.part" 2>/dev/null || echo 0)" -gt $((15 << 20)) ]; then
     small_files | tar czf "$OUT/res.tgz.part" -T -
   fi
   rm -f "/tmp/.pack.$BASHPID"
   [ -f "$OUT/res.tgz.part" ] && mv -f "$OUT/res.tgz.part" "$OUT/res.tgz")
}
# Ended from outside (the caller's own time limit, short of the jobs' limits): what is done so far
# still comes back. A call cut at 590 s once left its results on the machine, fetched only by a
# second call while it was still warm.
ended() {
  echo "ended from outside at $(date -u +%T)" >> "$OUT/jobs.txt"
  kill "$packer" 2>/dev/null
  while read -r g; do kill -TERM -- "-$g" 2>/dev/null; done < /tmp/logs/.groups
  pack
  exit 143
}
trap ended TERM INT
rm -f /tmp/logs/.groups

# Packed every PACK_EVERY seconds too: a call the device tool ends at its own limit (less device time
# left than asked) kills this script with no signal to trap, and only what lies in $OUT comes back.
# A session once lost a whole call's results so.
( while sleep "${PACK_EVERY:-30}"; do pack; done ) > /dev/null 2>&1 &
packer=$!
pids=()
for j in ${JOBS:?JOBS names the jobs}; do run_job "$j" & pids+=($!); done
wait "${pids[@]}"
kill "$packer" 2>/dev/null
cat "$OUT/jobs.txt"
pack
