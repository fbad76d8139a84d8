"""Lists a gRPC server's services through reflection v1alpha with Python's
grpcio-reflection (an implementation other than kpx's), then fetches the file
that defines SYMBOL and prints the services and messages it declares.

usage: reflection_v1alpha.py HOST:PORT SYMBOL
"""
import sys

import grpc
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc


def ask(stub, request):
    return next(iter(stub.ServerReflectionInfo(iter([request]), timeout=10)))


def main():
    target, symbol = sys.argv[1], sys.argv[2]
    stub = reflection_pb2_grpc.ServerReflectionStub(grpc.insecure_channel(target))
    listed = ask(stub, reflection_pb2.ServerReflectionRequest(list_services=""))
    for service in listed.list_services_response.service:
        print("service", service.name)
    found = ask(stub, reflection_pb2.ServerReflectionRequest(file_containing_symbol=symbol))
    if found.HasField("error_response"):
        print("error", found.error_response.error_message)
        return 1
    for raw in found.file_descriptor_response.file_descriptor_proto:
        file = descriptor_pb2.FileDescriptorProto.FromString(raw)
        for service in file.service:
            print("describes service", f"{file.package}.{service.name}",
                  " ".join(m.name for m in service.method))
        for message in file.message_type:
            print("describes message", f"{file.package}.{message.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
