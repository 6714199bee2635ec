"""Generated protobuf / gRPC modules (do not edit; regenerate with ``scripts/gen_protos.sh``).

``transfer.proto`` defines node-to-node object transfer, used by
``rtml.objectstore.transfer``.
"""
