# Device call 1: check the machine, stash the GGUF's first half, run the whole CLI path at test size (smoke.yaml).
set -u
date +%T; nvidia-smi -L
mkdir -p /root/xfer && cp .dev/a/gguf.part /root/xfer/gguf.part.a && echo "part A stashed: $(stat -c %s /root/xfer/gguf.part.a)"
source benchmarks/gpu_offline/env.sh
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . > $OUT/pip_e.log 2>&1; echo "pip -e rc $?"; which mtl-decoder accelerate
python3 -c "import torch, transformers, accelerate, peft, sys; print(sys.version.split()[0], torch.__version__, transformers.__version__, accelerate.__version__, peft.__version__, torch.cuda.get_device_name(0), hasattr(transformers, \"GgufConfig\"))"
python3 -c "import sys; sys.path.insert(0, 'tests'); from pathlib import Path; from hf_testkit import tiny_checkpoint; tiny_checkpoint(Path('/tmp/tiny-llama'))"
timeout 240 python3 benchmarks/gpu_row.py --config benchmarks/gpu_offline/smoke.yaml --logs /tmp/smoke-logs --results /tmp/smoke-results --evaluations test_bf16 > $OUT/smoke.out 2>&1; echo "smoke rc $?"
python3 - <<'PY'
import json
r = json.load(open("/tmp/smoke-results/gpu_smoke.json"))
print({k: (v["rc"], v["seconds"]) for k, v in r["steps"].items()})
for k, v in r["steps"].items():
    if v["rc"]:
        print("FAILED", k, v.get("output_tail", "")[-2500:])
print(r.get("summary", {}).get("tokens_per_s"), r.get("prediction"))
PY
grep -E "device:|done:|step " /tmp/smoke-logs/train.log | head
tar czf $OUT/smoke_logs.tgz -C /tmp smoke-logs smoke-results; date +%T
