#!/usr/bin/env bash
# Build the local control plane used by the end-to-end tests and `make demo`.
#
# Everything is built from the Go module proxy (no release tarballs are reachable):
#   etcd            go.etcd.io/etcd/server/v3            ($ETCD_VERSION)
#   kube-apiserver  k8s.io/kubernetes/cmd/kube-apiserver ($K8S_VERSION)
#   kube-scheduler  k8s.io/kubernetes/cmd/kube-scheduler ($K8S_VERSION)
#   kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager ($K8S_VERSION)
#   kwok            sigs.k8s.io/kwok/cmd/kwok            ($KWOK_VERSION)
#   karpenter       sigs.k8s.io/karpenter/kwok            ($KARPENTER_VERSION; Karpenter with its KWOK provider)
#   karpenter CRDs  sigs.k8s.io/karpenter pkg/apis/crds + kwok/apis/crds, copied beside the binary (crds/)
#   helm            helm.sh/helm/v3/cmd/helm              ($HELM_VERSION)
#   prometheus      github.com/prometheus/prometheus/cmd/prometheus ($PROMETHEUS_VERSION), and promtool
#
# Binaries land in ${TF_CACHE_DIR:-$HOME/.cache/tensor-fusion-extender}/bin/<component>-<version>/<component>
# and are reused on rerun ("cached: ..."). The Go module cache stays in the default GOPATH so rebuilds
# after a cache wipe are fast.
#
# k8s.io/kubernetes is not meant to be used as a module: its go.mod requires every k8s.io/<staging> module
# at v0.0.0 and replaces it with ./staging/src/k8s.io/<name>. The throwaway wrapper module below requires
# k8s.io/kubernetes@$K8S_VERSION and replaces every staging module with its published v0.<minor>.<patch>.
#
# Pinned versions build with Go 1.26 (measured on 2 cores, cold module cache: etcd ~70s, kube-apiserver
# ~270s, kube-scheduler ~25s after the apiserver, kwok ~120s; about 8-9 minutes in all). k8s v1.36.3 (the
# newest served 1.36 patch) builds as is, so no fallback to 1.35 is needed; override with K8S_VERSION=...
# kwok also gets its "fast" stage definitions copied next to the binary (stages.yaml, see build_kwok).
#
# Usage: tests/harness/build-control-plane.sh [component...]   (default: all)
#        Prints "export TF_BIN_<COMPONENT>=<path>" lines at the end for scripting.
set -euo pipefail

ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
K8S_VERSION="${K8S_VERSION:-v1.36.3}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
# v1.13.0 is the newest Karpenter that builds with Go 1.26 (v1.14+ asks for a newer toolchain).
KARPENTER_VERSION="${KARPENTER_VERSION:-v1.13.0}"
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
# Prometheus' Go module versions are v0.<major*100+minor>.<patch> (v0.316.0 is Prometheus 3.16.0).
PROMETHEUS_VERSION="${PROMETHEUS_VERSION:-v0.316.0}"
CACHE_DIR="${TF_CACHE_DIR:-$HOME/.cache/tensor-fusion-extender}"
BIN_DIR="$CACHE_DIR/bin"
GO_PARALLEL="${GO_PARALLEL:-2}"

export CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

log() { printf '[build-control-plane %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

command -v go >/dev/null || { log "go is not installed"; exit 1; }
mkdir -p "$BIN_DIR"
# One build at a time per cache: pytest-xdist workers, `make control-plane` and the demo may all ask at
# once; the others wait here and then find everything cached.
exec 9>"$CACHE_DIR/.build.lock"
flock 9

WORK_ROOT="$(mktemp -d "${TMPDIR:-/tmp}/tf-cp-build.XXXXXX")"
trap 'rm -rf "$WORK_ROOT"' EXIT

# out_path <component> <version> -> path of the binary
out_path() { echo "$BIN_DIR/$1-$2/$1"; }

is_cached() {
  local out; out="$(out_path "$1" "$2")"
  if [[ -x "$out" ]]; then
    log "cached: $1 $2 -> $out"
    return 0
  fi
  return 1
}

# install_bin <tmp-binary> <component> <version>: atomic move into the cache
install_bin() {
  local dir="$BIN_DIR/$2-$3"
  mkdir -p "$dir"
  mv -f "$1" "$dir/$2.tmp.$$"
  mv -f "$dir/$2.tmp.$$" "$dir/$2"
  log "built: $2 $3 -> $dir/$2"
}

# build_go_command <component> <version> <package> [ldflags]: a throwaway module that requires the command's
# package at that version (so go.sum covers everything it imports), built stripped into the cache
build_go_command() {
  local comp="$1" ver="$2" pkg="$3" ld="-s -w${4:+ $4}"
  local t0=$SECONDS w="$WORK_ROOT/$1"
  log "building $comp $ver ($pkg)"
  mkdir -p "$w" && cd "$w"
  go mod init "tf-wrapper-$comp" >/dev/null 2>&1
  go get "$pkg@$ver"
  go build -p "$GO_PARALLEL" -trimpath -ldflags "$ld" -o "$w/$comp" "$pkg"
  install_bin "$w/$comp" "$comp" "$ver"
  log "$comp done in $((SECONDS - t0))s"
}

build_etcd() {
  is_cached etcd "$ETCD_VERSION" && return 0
  build_go_command etcd "$ETCD_VERSION" go.etcd.io/etcd/server/v3 \
    "-X go.etcd.io/etcd/api/v3/version.GitSHA=module-$ETCD_VERSION"
}

# k8s wrapper module shared by kube-apiserver, kube-scheduler and kube-controller-manager
prepare_k8s_wrapper() {
  local w="$WORK_ROOT/k8s"
  [[ -f "$w/.ready" ]] && { echo "$w"; return 0; }
  mkdir -p "$w"
  local staging_ver="v0.${K8S_VERSION#v1.}"
  log "preparing k8s.io/kubernetes $K8S_VERSION wrapper (staging modules at $staging_ver)"
  (
    cd "$w"
    go mod init tf-wrapper-k8s >/dev/null 2>&1
    local gomod
    gomod="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
    [[ -f "$gomod" ]] || { log "could not download k8s.io/kubernetes@$K8S_VERSION"; exit 1; }
    # every staging module is replaced by ./staging/src/k8s.io/<name> in kubernetes' own go.mod
    local mods
    mods="$(grep -oE 'k8s\.io/[A-Za-z0-9._-]+ => \./staging/src/k8s\.io/[A-Za-z0-9._-]+' "$gomod" | awk '{print $1}' | sort -u)"
    [[ -n "$mods" ]] || { log "no staging modules found in $gomod"; exit 1; }
    log "replacing $(echo "$mods" | wc -l) staging modules"
    local args=()
    for m in $mods; do args+=("-replace=$m=$m@$staging_ver"); done
    go mod edit "${args[@]}"
    go mod edit -require="k8s.io/kubernetes@$K8S_VERSION"
    # a file importing the commands so `go mod tidy` records every dependency
    cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
)
GO
    log "resolving dependencies (go mod tidy)"
    go mod tidy -e >/dev/null 2>&1 || true
    go mod download
    touch .ready
  ) >&2
  echo "$w"
}

build_k8s() {
  local comp="$1"
  is_cached "$comp" "$K8S_VERSION" && return 0
  local t0=$SECONDS w
  w="$(prepare_k8s_wrapper)"
  local minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  local ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    ld+=" -X $p.gitTreeState=clean -X $p.gitCommit=0000000000000000000000000000000000000000"
    ld+=" -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  log "building $comp $K8S_VERSION (this takes a while on few cores)"
  (cd "$w" && go build -p "$GO_PARALLEL" -trimpath -tags tools -ldflags "$ld" -o "$w/$comp" "k8s.io/kubernetes/cmd/$comp") >&2
  install_bin "$w/$comp" "$comp" "$K8S_VERSION"
  log "$comp done in $((SECONDS - t0))s"
}

build_kwok() {
  if ! is_cached kwok "$KWOK_VERSION"; then
    build_go_command kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok \
      "-X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION"
  fi
  # The kwok binary embeds no stages. Ship kwok's own "fast" stages next to the binary: nodes become
  # Ready (and heartbeat), pods bound to managed nodes become Running with a pod IP, and deleted pods go
  # away. pod-complete (Job pods finish at once) is left out on purpose: GPU pods must keep running.
  local stages="$BIN_DIR/kwok-$KWOK_VERSION/stages.yaml"
  if [[ ! -s "$stages" ]]; then
    local src
    src="$(cd "$WORK_ROOT" && go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
    {
      for f in node/fast/node-initialize.yaml node/heartbeat/node-heartbeat.yaml \
               pod/fast/pod-ready.yaml pod/fast/pod-delete.yaml; do
        echo "---"
        cat "$src/kustomize/stage/$f"
      done
    } > "$stages.tmp.$$"
    mv -f "$stages.tmp.$$" "$stages"
    log "wrote kwok stages: $stages"
  else
    log "cached: kwok stages $stages"
  fi
}

# Karpenter with its KWOK cloud provider, and the CRDs of the very same module version (the e2e suite and
# the demo install these; nothing is copied into the repository).
build_karpenter() {
  if ! is_cached karpenter "$KARPENTER_VERSION"; then
    build_go_command karpenter "$KARPENTER_VERSION" sigs.k8s.io/karpenter/kwok
  fi
  karpenter_crds
}

# karpenter_crds: Karpenter's CRDs (NodePool, NodeClaim, NodeOverlay, KWOKNodeClass) from the module zip
karpenter_crds() {
  local dir="$BIN_DIR/karpenter-$KARPENTER_VERSION/crds"
  if [[ -s "$dir/karpenter.sh_nodeclaims.yaml" ]]; then
    log "cached: karpenter CRDs $dir"
    return 0
  fi
  local src
  src="$(cd "$WORK_ROOT" && go mod download -json "sigs.k8s.io/karpenter@$KARPENTER_VERSION" \
          | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
  [[ -d "$src/pkg/apis/crds" ]] || { log "no pkg/apis/crds in sigs.k8s.io/karpenter@$KARPENTER_VERSION"; exit 1; }
  mkdir -p "$dir.tmp.$$"
  cp "$src"/pkg/apis/crds/*.yaml "$src"/kwok/apis/crds/*.yaml "$dir.tmp.$$/"
  chmod -R u+w "$dir.tmp.$$"
  rm -rf "$dir" && mv "$dir.tmp.$$" "$dir"
  log "wrote karpenter CRDs: $dir ($(ls "$dir" | wc -l) files)"
}

build_helm() {
  is_cached helm "$HELM_VERSION" && return 0
  build_go_command helm "$HELM_VERSION" helm.sh/helm/v3/cmd/helm \
    "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
}

# Prometheus and promtool for the usage tests: a real server scraping a dcgm-exporter stand-in, with history
# backfilled by promtool. Built without the `builtinassets` tag (the HTTP API works, the web UI does not) and
# with `remove_all_sd` (static_configs only: the cloud service discoveries, most of the build, are left out).
build_prometheus() {
  local comp="$1"
  is_cached "$comp" "$PROMETHEUS_VERSION" && return 0
  GOFLAGS="$GOFLAGS -tags=remove_all_sd" build_go_command "$comp" "$PROMETHEUS_VERSION" "github.com/prometheus/prometheus/cmd/$comp" \
    "-X github.com/prometheus/common/version.Version=$PROMETHEUS_VERSION"
}

components=("$@")
[[ ${#components[@]} -gt 0 ]] || components=(etcd kube-apiserver kube-scheduler kube-controller-manager kwok karpenter helm prometheus promtool)
T0=$SECONDS
for c in "${components[@]}"; do
  case "$c" in
    etcd) build_etcd ;;
    kube-apiserver|kube-scheduler|kube-controller-manager) build_k8s "$c" ;;
    kwok) build_kwok ;;
    karpenter) build_karpenter ;;
    karpenter-crds) karpenter_crds ;;
    helm) build_helm ;;
    prometheus|promtool) build_prometheus "$c" ;;
    *) log "unknown component: $c"; exit 2 ;;
  esac
done
log "all done in $((SECONDS - T0))s; cache: $BIN_DIR"
echo "export TF_BIN_ETCD=$(out_path etcd "$ETCD_VERSION")"
echo "export TF_BIN_KUBE_APISERVER=$(out_path kube-apiserver "$K8S_VERSION")"
echo "export TF_BIN_KUBE_SCHEDULER=$(out_path kube-scheduler "$K8S_VERSION")"
echo "export TF_BIN_KUBE_CONTROLLER_MANAGER=$(out_path kube-controller-manager "$K8S_VERSION")"
echo "export TF_BIN_KARPENTER=$(out_path karpenter "$KARPENTER_VERSION")"
echo "export TF_BIN_KARPENTER_CRDS=$BIN_DIR/karpenter-$KARPENTER_VERSION/crds"
echo "export TF_BIN_HELM=$(out_path helm "$HELM_VERSION")"
echo "export TF_BIN_PROMETHEUS=$(out_path prometheus "$PROMETHEUS_VERSION")"
echo "export TF_BIN_PROMTOOL=$(out_path promtool "$PROMETHEUS_VERSION")"
echo "export TF_BIN_KWOK=$(out_path kwok "$KWOK_VERSION")"
echo "export TF_BIN_KWOK_STAGES=$BIN_DIR/kwok-$KWOK_VERSION/stages.yaml"
