#!/usr/bin/env bash
# Regenerate the committed protobuf/gRPC modules in rtml/rpc/protos/ from their .proto files.
#
#   scripts/gen_protos.sh          (from any directory; needs: pip install grpcio-tools)
#
# grpcio-tools is a dev tool, not a runtime dependency. The generated modules refuse to import
# under a grpcio / protobuf runtime older than the grpcio-tools that generated them, so after
# regenerating, raise the floors of "grpcio" and "protobuf" in pyproject.toml to the versions
# printed below.
set -euo pipefail
cd "$(dirname "$0")/.."

# -I. with the repo-relative path makes protoc name the module by its package path, so the
# grpc module imports "from rtml.rpc.protos import transfer_pb2" (absolute), not
# "import transfer_pb2" (which only works with the directory on sys.path).
# --pyi_out writes transfer_pb2.pyi, which gives mypy the message classes' fields.
python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. \
    rtml/rpc/protos/transfer.proto

# Should the bare form appear anyway (protoc emits it when run with -I rtml/rpc/protos),
# rewrite it, then insist it is gone.
sed -i -E 's/^import (transfer_pb2) as /from rtml.rpc.protos import \1 as /' \
    rtml/rpc/protos/transfer_pb2_grpc.py
if grep -qE '^import transfer_pb2' rtml/rpc/protos/transfer_pb2_grpc.py; then
    echo "gen_protos.sh: relative import left in transfer_pb2_grpc.py" >&2
    exit 1
fi

grep -h -E "^GRPC_GENERATED_VERSION|^# Protobuf Python Version" rtml/rpc/protos/transfer_pb2*.py
