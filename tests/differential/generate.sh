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
# The cron cases (`cron_cases()`) run through `tfrecommend cron`: robfig/cron at the version TensorFusion's
# go.mod pins, and TensorFusion's own CronRecommender, whose one `time.Now()` is replaced by a settable
# clock (tfrecommend/clock.go.txt; the build stops if that line is not found exactly once).
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

if [[ ! -x "$BIN" || "$HERE/tfrecommend/main.go" -nt "$BIN" || "$HERE/tfrecommend/clock.go.txt" -nt "$BIN" ]]; then
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    git -C "$SOURCE" archive "$TF_COMMIT" | tar -x -C "$work"
    mkdir -p "$work/cmd/tfrecommend" "$(dirname "$BIN")"
    cp "$HERE/tfrecommend/main.go" "$work/cmd/tfrecommend/main.go"
    cron_go="$work/internal/autoscaler/recommender/cron_recommender.go"
    if [[ "$(grep -c 'currentTime := time.Now()' "$cron_go")" != 1 ]]; then
        echo "generate.sh: cron_recommender.go no longer has one 'currentTime := time.Now()'" >&2
        exit 1
    fi
    sed -i 's/currentTime := time.Now()/currentTime := goldenNow().In(time.Local)/' "$cron_go"
    cp "$HERE/tfrecommend/clock.go.txt" "$work/internal/autoscaler/recommender/golden_clock.go"
    start=$SECONDS
    (cd "$work" && go build -o "$BIN" ./cmd/tfrecommend)
    echo "built $BIN in $((SECONDS - start))s" >&2
else
    echo "cached: $BIN" >&2
fi

cd "$ROOT"
"$PYTHON" -m tests.differential.cases > "$CACHE_DIR/tfrecommend-cases.json"
"$BIN" < "$CACHE_DIR/tfrecommend-cases.json" > "$CACHE_DIR/tfrecommend-out.json"
"$PYTHON" -m tests.differential.cases cron > "$CACHE_DIR/tfrecommend-cron-cases.json"
"$BIN" cron < "$CACHE_DIR/tfrecommend-cron-cases.json" > "$CACHE_DIR/tfrecommend-cron-out.json"
"$PYTHON" - "$CACHE_DIR/tfrecommend-out.json" "$CACHE_DIR/tfrecommend-cron-out.json" "$HERE" "$TF_COMMIT" <<'PY'
import hashlib, json, pathlib, sys
from tests.differential.cases import cases, cron_cases
here, commit = pathlib.Path(sys.argv[3]), sys.argv[4]
def digest(value):
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()
out = json.loads(pathlib.Path(sys.argv[1]).read_text())
golden = {"tensor_fusion_commit": commit, "cases_sha256": digest(cases()), "results": out}
(here / "golden.json").write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
cron = json.loads(pathlib.Path(sys.argv[2]).read_text())
golden_cron = {"tensor_fusion_commit": commit, "cases_sha256": digest(cron_cases()), "results": cron}
(here / "golden_cron.json").write_text(json.dumps(golden_cron, indent=1, sort_keys=True) + "\n")
print(f"wrote golden.json: {len(out)} cases; golden_cron.json: {len(cron['parse'])} expressions, "
      f"{len(cron['next'])} next times, {len(cron['cases'])} rule cases")
PY
