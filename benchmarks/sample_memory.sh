#!/usr/bin/env bash
# Every 20 s while a python process whose command line matches PATTERN runs: the time, its peak resident size, its own
# (anonymous) and file-page resident memory in MiB, and the machine's available memory; for
# benchmarks/state_cache_memory.py --training-log.   usage: sample_memory.sh PATTERN > LOG
set -u
pattern=$1
while true; do
  pid=$(pgrep -f "python.*$pattern" | head -1)  # "python": not this script, whose own command line holds PATTERN
  if [ -n "$pid" ] && [ -r "/proc/$pid/status" ]; then
    echo "$(date +%H:%M:%S) $(awk '/VmHWM|RssAnon|RssFile/{printf "%s %d ", $1, $2/1024}' "/proc/$pid/status") avail $(awk '/MemAvailable/{print int($2/1024)}' /proc/meminfo)"
  fi
  sleep 20
done
