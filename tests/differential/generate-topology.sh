#!/usr/bin/env bash
# Regenerate tests/differential/topology_golden.json: what TensorFusion's own GPU topology evaluators
# (internal/scheduler/gputopo) choose on the cases of tests/differential/topology_cases.py.
#
# Like generate.sh: gputopo is under internal/, so this copies a TensorFusion checkout at $TF_COMMIT into a
# temporary module, drops tftopo/main.go in as cmd/tftopo, builds it (dependencies from the Go module proxy)
# into ${TF_CACHE_DIR:-~/.cache/tensor-fusion-extender}/bin/tftopo-<commit>/tftopo, and runs it.
#
# Usage: tests/differential/generate-topology.sh [TENSOR_FUSION_GIT_DIR]
set -euo pipefail

TF_COMMIT="${TF_COMMIT:-3e0a4901044d78226e14f67e8c5d29c269c943e2}"
SOURCE="${1:-${TF_SOURCE:-/work/.mirror/NexusGPU+tensor-fusion/repo}}"
CACHE_DIR="${TF_CACHE_DIR:-$HOME/.cache/tensor-fusion-extender}"
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BIN="$CACHE_DIR/bin/tftopo-${TF_COMMIT:0:12}/tftopo"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"

if [[ ! -x "$BIN" || "$HERE/tftopo/main.go" -nt "$BIN" ]]; then
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    git -C "$SOURCE" archive "$TF_COMMIT" | tar -x -C "$work"
    mkdir -p "$work/cmd/tftopo" "$(dirname "$BIN")"
    cp "$HERE/tftopo/main.go" "$work/cmd/tftopo/main.go"
    start=$SECONDS
    (cd "$work" && go build -o "$BIN" ./cmd/tftopo)
    echo "built $BIN in $((SECONDS - start))s" >&2
else
    echo "cached: $BIN" >&2
fi

cd "$ROOT"
"$PYTHON" -m tests.differential.topology_cases > "$CACHE_DIR/tftopo-cases.json"
"$BIN" < "$CACHE_DIR/tftopo-cases.json" > "$CACHE_DIR/tftopo-out.json"
"$PYTHON" - "$CACHE_DIR/tftopo-out.json" "$HERE/topology_golden.json" "$TF_COMMIT" <<'PY'
import hashlib, json, pathlib, sys
from tests.differential.topology_cases import cases
out = json.loads(pathlib.Path(sys.argv[1]).read_text())
digest = hashlib.sha256(json.dumps(cases(), sort_keys=True).encode()).hexdigest()
golden = {"tensor_fusion_commit": sys.argv[3], "cases_sha256": digest, "results": out}
pathlib.Path(sys.argv[2]).write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
print(f"wrote {sys.argv[2]}: {len(out)} cases")
PY
