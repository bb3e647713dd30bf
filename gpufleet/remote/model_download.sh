#!/bin/bash
# Download a hub model with the Hugging Face CLI (the venv's first, then PATH's); HF_TOKEN from the environment.
# Args: $1 model id, $2 local directory, $3 venv.
set -e
model=$1 dir=$2 venv=$3
mkdir -p -- "$dir"
for tool in "$venv/bin/hf" "$(command -v hf || true)"; do
    if [ -n "$tool" ] && [ -x "$tool" ]; then exec "$tool" download "$model" --local-dir "$dir"; fi
done
for tool in "$venv/bin/huggingface-cli" "$(command -v huggingface-cli || true)"; do
    if [ -n "$tool" ] && [ -x "$tool" ]; then exec "$tool" download "$model" --local-dir "$dir"; fi
done
echo "neither hf nor huggingface-cli found (pip install -U huggingface_hub in $venv)"
exit 127
