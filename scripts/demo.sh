#!/usr/bin/env bash
# Sets everything up and runs the default job: the bundled demo model (models/qwen35-demo, a
# small Qwen3.5-MoE trained on the King James Bible) generating from a prompt — on the GPU when
# one is present, else on the CPU. Extra arguments go to `deltaserve generate`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
MODEL=${DS_MODEL:-models/qwen35-demo}
PROMPT=${DS_PROMPT:-"In the beginning God created"}
echo "== deltaserve generate -m $MODEL -p \"$PROMPT\" -n 64 --temperature 0.8 --seed 7 $*"
exec build/deltaserve generate -m "$MODEL" -p "$PROMPT" -n 64 --temperature 0.8 --seed 7 "$@"
