# Sourced by call1.sh and call2.sh: offline, unbuffered, the carried wheels installed and the data in place.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=8
export PYTHONPATH=/tmp/site:$PWD
if [ ! -f /tmp/site/seqeval/__init__.py ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .dev/wheels/*.whl || exit 3
fi
if [ ! -f ../shared/data/conll2003/train.jsonl ]; then
  mkdir -p ../shared/data && tar xJf .dev/data.tar.xz -C ../shared/data || exit 4
fi
