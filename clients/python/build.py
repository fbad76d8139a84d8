"""Generates the Python code of kpx's own messages from proto/kpx/v1/kpx.proto with
grpcio-tools, into clients/python/generated/ (Envoy's messages come from the PyPI
package xds-protos). Run once before the control plane; it runs this itself if needed.

usage: python3 build.py
"""
import pathlib
import sys

from grpc_tools import protoc

HERE = pathlib.Path(__file__).resolve().parent
PROTO_ROOT = HERE.parent.parent / "proto"
OUT = HERE / "generated"


def build():
    OUT.mkdir(exist_ok=True)
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    code = protoc.main([
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={OUT}",
        str(PROTO_ROOT / "kpx" / "v1" / "kpx.proto"),
    ])
    if code != 0:
        raise SystemExit(f"protoc failed on {PROTO_ROOT / 'kpx/v1/kpx.proto'}")
    for package in (OUT / "kpx", OUT / "kpx" / "v1"):
        (package / "__init__.py").touch()


if __name__ == "__main__":
    build()
    print(f"generated kpx/v1/kpx_pb2.py under {OUT}", file=sys.stderr)
