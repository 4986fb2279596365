#!/usr/bin/env bash
# Regenerate tests/differential/golden.json: what TensorFusion's own Go recommender recommends on the cases
# of tests/differential/cases.py.
#
# TensorFusion's recommender is under internal/, so it cannot be imported from another module, and the Go
# module proxy does not serve github.com/NexusGPU/tensor-fusion. This script copies a TensorFusion checkout
# at $TF_COMMIT into a temporary module, drops main.go (beside this script) in as cmd/tfrecommend, builds
# it (its dependencies, VPA v1.6.0 among them, come from the Go module proxy) into
# ${TF_CACHE_DIR:-~/.cache/tensor-fusion-extender}/bin/tfrecommend-<commit>/tfrecommend, and runs it.
#
# Usage: tests/differential/generate.sh [TENSOR_FUSION_GIT_DIR]
#        (default: $TF_SOURCE, else /work/.mirror/NexusGPU+tensor-fusion/repo)
set -euo pipefail

TF_COMMIT="${TF_COMMIT:-3e0a4901044d78226e14f67e8c5d29c269c943e2}"
SOURCE="${1:-${TF_SOURCE:-/work/.mirror/NexusGPU+tensor-fusion/repo}}"
CACHE_DIR="${TF_CACHE_DIR:-$HOME/.cache/tensor-fusion-extender}"
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BIN="$CACHE_DIR/bin/tfrecommend-${TF_COMMIT:0:12}/tfrecommend"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"

if [[ ! -x "$BIN" || "$HERE/main.go" -nt "$BIN" ]]; then
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    git -C "$SOURCE" archive "$TF_COMMIT" | tar -x -C "$work"
    mkdir -p "$work/cmd/tfrecommend" "$(dirname "$BIN")"
    cp "$HERE/main.go" "$work/cmd/tfrecommend/main.go"
    start=$SECONDS
    (cd "$work" && go build -o "$BIN" ./cmd/tfrecommend)
    echo "built $BIN in $((SECONDS - start))s" >&2
else
    echo "cached: $BIN" >&2
fi

cd "$ROOT"
"$PYTHON" -m tests.differential.cases > "$CACHE_DIR/tfrecommend-cases.json"
"$BIN" < "$CACHE_DIR/tfrecommend-cases.json" > "$CACHE_DIR/tfrecommend-out.json"
"$PYTHON" - "$CACHE_DIR/tfrecommend-out.json" "$HERE/golden.json" "$TF_COMMIT" <<'PY'
import hashlib, json, pathlib, sys
from tests.differential.cases import cases
out = json.loads(pathlib.Path(sys.argv[1]).read_text())
digest = hashlib.sha256(json.dumps(cases(), sort_keys=True).encode()).hexdigest()
golden = {"tensor_fusion_commit": sys.argv[3], "cases_sha256": digest, "results": out}
pathlib.Path(sys.argv[2]).write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
print(f"wrote {sys.argv[2]}: {len(out)} cases")
PY
