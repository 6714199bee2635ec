from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class PullRequest(_message.Message):
    __slots__ = ("object_id", "requester_node")
    OBJECT_ID_FIELD_NUMBER: _ClassVar[int]
    REQUESTER_NODE_FIELD_NUMBER: _ClassVar[int]
    object_id: bytes
    requester_node: bytes
    def __init__(self, object_id: _Optional[bytes] = ..., requester_node: _Optional[bytes] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("total_size", "offset", "data")
    TOTAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    total_size: int
    offset: int
    data: bytes
    def __init__(self, total_size: _Optional[int] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class StreamTicket(_message.Message):
    __slots__ = ("ticket", "port", "total_size")
    TICKET_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    ticket: bytes
    port: int
    total_size: int
    def __init__(self, ticket: _Optional[bytes] = ..., port: _Optional[int] = ..., total_size: _Optional[int] = ...) -> None: ...
