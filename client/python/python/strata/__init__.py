"""Strata: the Python client of a Strata KV-cache node.

``StrataStore`` has the method names, arguments and integer return codes of Mooncake's
``MooncakeDistributedStore``, and accepts every form of Mooncake's ``setup`` (``strata/store.py``), so an
engine that uses Mooncake switches by changing its import alone::

    from strata import StrataStore as MooncakeDistributedStore, ReplicateConfig
    store = MooncakeDistributedStore()
    store.setup("localhost", "", 512 << 20, 128 << 20, "tcp", "", "127.0.0.1:7600")  # the node's address
    store.setup("127.0.0.1:7600")                         # Strata's own form: an address, or a list

Puts return 0 or a negative code; reads into buffers return the bytes read or a negative code; ``get``
returns empty bytes on failure; ``is_exist`` returns 1, 0 or a negative code. The codes are Mooncake's
where Mooncake has one (``OBJECT_NOT_FOUND`` = -704, ``OBJECT_ALREADY_EXISTS`` = -705, ...) and Strata's
below -2000 otherwise (``CHECKSUM_MISMATCH``, ``STORAGE_ERROR``, ``QUOTA_EXCEEDED``, ``KEY_MOVED``). Every call releases
the GIL while it waits on the network.
"""

from ._strata import (  # noqa: F401  (re-exported)
    CHECKSUM_MISMATCH,
    ILLEGAL_CLIENT,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    KEY_MOVED,
    NO_AVAILABLE_HANDLE,
    OBJECT_ALREADY_EXISTS,
    OBJECT_NOT_FOUND,
    OK,
    QUOTA_EXCEEDED,
    RPC_FAIL,
    STORAGE_ERROR,
    TRANSFER_FAIL,
    UNAVAILABLE_IN_CURRENT_STATUS,
    EventSubscription,
    ProgressivePut,
)
from .store import BufferHandle, ReplicaDescriptor, StrataStore  # noqa: F401  (re-exported)

__all__ = [
    "StrataStore",
    "BufferHandle",
    "ReplicaDescriptor",
    "EventSubscription",
    "ProgressivePut",
    "ReplicateConfig",
    "error_name",
    "OK",
    "INTERNAL_ERROR",
    "NO_AVAILABLE_HANDLE",
    "INVALID_PARAMS",
    "ILLEGAL_CLIENT",
    "OBJECT_NOT_FOUND",
    "OBJECT_ALREADY_EXISTS",
    "TRANSFER_FAIL",
    "RPC_FAIL",
    "UNAVAILABLE_IN_CURRENT_STATUS",
    "CHECKSUM_MISMATCH",
    "STORAGE_ERROR",
    "QUOTA_EXCEEDED",
    "KEY_MOVED",
]


class ReplicateConfig:
    """Options of a put, with Mooncake's field names and Strata's additions.

    ``with_soft_pin``: evicted only when nothing else can be, for ``soft_pin_ttl_seconds`` (0: the node's
    default, 10 minutes). ``with_hard_pin`` (Strata): never evicted, removed only by ``remove``; survives a
    restart. ``upsert`` (Strata): replace a stored version instead of answering ``OBJECT_ALREADY_EXISTS``.
    ``write_policy`` (Strata): ``"write-through"``, ``"write-back"`` or ``"durable"`` (None: the node's).
    ``replica_num``: the nodes that store the put in a cluster (one node keeps one copy); a put without a
    config gets the store's ``replicas`` option. ``preferred_segment``, ``preferred_segments`` and
    ``prefer_alloc_in_same_node`` are accepted for compatibility; placement decides where a key lives.
    """

    def __init__(
        self,
        replica_num=1,
        with_soft_pin=False,
        preferred_segment="",
        with_hard_pin=False,
        soft_pin_ttl_seconds=0,
        upsert=False,
        write_policy=None,
        preferred_segments=None,
        prefer_alloc_in_same_node=False,
    ):
        self.replica_num = replica_num
        self.with_soft_pin = with_soft_pin
        self.preferred_segment = preferred_segment
        self.preferred_segments = list(preferred_segments or [])
        self.prefer_alloc_in_same_node = prefer_alloc_in_same_node
        self.with_hard_pin = with_hard_pin
        self.soft_pin_ttl_seconds = soft_pin_ttl_seconds
        self.upsert = upsert
        self.write_policy = write_policy

    def __repr__(self):
        fields = ", ".join(f"{name}={value!r}" for name, value in vars(self).items())
        return f"ReplicateConfig({fields})"


_NAMES = {value: name for name, value in globals().items() if name.isupper() and isinstance(value, int)}


def error_name(code):
    """The name of a return code (``-704`` → ``"OBJECT_NOT_FOUND"``); a non-negative code is ``"OK"``."""
    if code >= 0:
        return "OK"
    return _NAMES.get(code, f"UNKNOWN({code})")
