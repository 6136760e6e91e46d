"""``StrataStore``: the native store with every form of Mooncake's ``MooncakeDistributedStore`` calls.

Engines call Mooncake's store in several forms; each is accepted here, so that replacing
``from mooncake.store import MooncakeDistributedStore`` by
``from strata import StrataStore as MooncakeDistributedStore`` is the only change an engine needs:

- ``setup(local_hostname, metadata_server, global_segment_size, local_buffer_size, protocol, device_name,
  master_server_address, engine)``, positional or by keyword (``rdma_devices`` and ``master_server_addr``
  too), with ``tenant_id=``; ``setup(config_dict)`` with the same keys (LMCache); ``setup_dummy(mem_pool_size,
  local_buffer_size, server_address)`` (SGLang); and Strata's own ``setup("host:port" or a list, **options)``.
  ``master_server_address`` (or ``server_address``) names the Strata node: ``"host:port"``, a list of them,
  or a comma-separated string, tried in order; a node of a cluster makes the store a client of the whole
  cluster, whose members it learns from the node (Strata's option ``single_node=True``: that node alone). The segment and buffer sizes, the protocol and the devices
  are accepted and unused: the node owns its memory, and transfers go over TCP (or shared memory, below). ``engine`` (a Mooncake
  ``TransferEngine`` to share, which SGLang passes eighth, usually None) is accepted and unused: Strata has
  its own transport. ``tenant_id``, when not empty, is the tenant's token (the node's ``--tenant`` list).
  ``metadata_server`` of the form ``"etcd://host:port[,host:port…]"`` means a cluster: the store reads its
  members from etcd, routes each key to the nodes that own it, and ``master_server_address`` may be empty;
  any other ``metadata_server`` is unused. ``ReplicateConfig.replica_num`` is the number of nodes that store
  a put in a cluster (Strata options ``cluster_name``, ``replicas`` and ``min_replicas`` by keyword).
- ``alloc_buffer(size)``: shared memory that a node on this host copies values into and out of (the
  ``*_into`` / ``*_from`` calls on its addresses); Strata's own, beside Mooncake's ``register_buffer``.
- ``remove(key, force=)``, ``remove_all(force=)``, ``remove_by_regex(pattern, force=)``,
  ``batch_remove(keys, force=)``: ``force`` is accepted; a node has no lease that blocks a removal.
- ``list_keys()``: Strata's own, every key the node (or the cluster) holds for the store's tenant, as bytes,
  each once (SCAN, a page per round trip per shard); LMCache's ``list()`` is built on it.
"""

import ctypes
import socket

from ._strata import INVALID_PARAMS, OBJECT_ALREADY_EXISTS, OK
from ._strata import StrataStore as _NativeStore

_MOONCAKE_SETUP = (
    "local_hostname",
    "metadata_server",
    "global_segment_size",
    "local_buffer_size",
    "protocol",
    "device_name",
    "master_server_address",
    "engine",
)
_ALIASES = {"rdma_devices": "device_name", "master_server_addr": "master_server_address"}
_STRATA_OPTIONS = (
    "token",
    "timeout_seconds",
    "verify_checksums",
    "shared_memory",
    "spin_microseconds",
    "cluster_name",
    "replicas",
    "min_replicas",
    "single_node",
)


def _node_addresses(named):
    """The node addresses a Mooncake-style setup names: a str (commas allowed) or a list; None if none."""
    if isinstance(named, (list, tuple)):
        addresses = [str(address).strip() for address in named]
    elif isinstance(named, str):
        addresses = [address.strip() for address in named.split(",")]
    else:
        return None
    addresses = [address for address in addresses if address]
    return addresses or None


def _mooncake_arguments(args, kwargs):
    """Mooncake's setup arguments by name, from positional, keyword or one-dict forms (a dict may carry
    other keys of the engine's config: they are ignored)."""
    if len(args) == 1 and isinstance(args[0], dict) and not kwargs:
        named = dict(args[0])
    else:
        if len(args) > len(_MOONCAKE_SETUP):
            raise TypeError(f"setup() takes at most {len(_MOONCAKE_SETUP)} positional arguments")
        if len(args) == 1 and not isinstance(args[0], str):
            raise TypeError("setup() takes a node address (str or list), a config dict, or Mooncake's arguments")
        named = dict(zip(_MOONCAKE_SETUP, args))
        for name, value in kwargs.items():
            name = _ALIASES.get(name, name)
            if name not in _MOONCAKE_SETUP:
                raise TypeError(f"setup() got an unexpected keyword argument {name!r}")
            if name in named:
                raise TypeError(f"setup() got multiple values for argument {name!r}")
            named[name] = value
    return {_ALIASES.get(name, name): value for name, value in named.items()}


class BufferHandle(bytearray):
    """A value returned by ``get_buffer``: a bytearray (the buffer protocol, so numpy and torch read it
    without a copy) with Mooncake's ``ptr()`` and ``size()``."""

    def ptr(self):
        """The address of the first byte (valid while this object lives)."""
        if not self:
            return 0
        return ctypes.addressof((ctypes.c_char * len(self)).from_buffer(self))

    def size(self):
        """The length in bytes."""
        return len(self)


class ReplicaDescriptor:
    """Where a key's value is, in Mooncake's descriptor shape: one per tier that holds it on its node.

    ``node`` is the node's address, ``tier`` ``"dram"`` or ``"nvme"``, ``size`` the value's length and
    ``status`` ``"COMPLETE"``. A DRAM copy is a memory replica, an NVMe record a disk replica (its
    descriptor's ``file_path`` names the node and tier, not a file of this machine)."""

    def __init__(self, node, tier, size):
        self.node = node
        self.tier = tier
        self.size = size
        self.status = "COMPLETE"

    def is_memory_replica(self):
        return self.tier == "dram"

    def is_disk_replica(self):
        return self.tier == "nvme"

    def get_memory_descriptor(self):
        if not self.is_memory_replica():
            raise ValueError("not a memory replica")
        # Mooncake's releases spell the buffer list both ways; its fields carry a trailing underscore.
        buffer = _Descriptor(segment_name=self.node, transport_endpoint_=self.node, size=self.size, size_=self.size)
        return _Descriptor(buffer_descriptor=buffer, buffer_descriptors=[buffer])

    def get_disk_descriptor(self):
        if not self.is_disk_replica():
            raise ValueError("not a disk replica")
        return _Descriptor(file_path=f"{self.node}/nvme", object_size=self.size)

    def __repr__(self):
        return f"ReplicaDescriptor(node={self.node!r}, tier={self.tier!r}, size={self.size})"


class _Descriptor:
    def __init__(self, **fields):
        self.__dict__.update(fields)


class StrataStore(_NativeStore):
    """A connection to a Strata node with Mooncake's store methods (see the module doc)."""

    def __init__(self):
        super().__init__()
        self._local_hostname = None
        self._shared_buffers = []

    def alloc_buffer(self, size):
        """``size`` bytes of shared memory, registered as a buffer: a writable ctypes array (the buffer
        protocol: ``numpy.frombuffer``, ``torch.frombuffer`` and ``memoryview`` use it without a copy;
        ``ctypes.addressof`` gives the address the ``*_into`` / ``*_from`` calls take). A node on this host
        copies values into and out of it directly; elsewhere the same calls use TCP. It lives as long as
        the store. Buffers the caller allocated itself (``register_buffer``) always use TCP."""
        address = super().alloc_buffer(size)
        array = (ctypes.c_ubyte * size).from_address(address)
        self._shared_buffers.append(array)
        return array

    # ---- setup --------------------------------------------------------------------------------------

    def setup(self, *args, **kwargs):
        """Connects to a node; every Mooncake form and Strata's own (module doc). Returns 0 or a code."""
        strata_form = (
            len(args) == 1
            and isinstance(args[0], (str, list, tuple))
            and all(name in _STRATA_OPTIONS for name in kwargs)
        )
        if strata_form:
            return super().setup(args[0], **kwargs)
        options = {name: kwargs.pop(name) for name in list(kwargs) if name in _STRATA_OPTIONS}
        tenant = kwargs.pop("tenant_id", None)
        named = _mooncake_arguments(args, kwargs)
        tenant = named.pop("tenant_id", tenant)
        if tenant and "token" not in options:
            options["token"] = tenant
        self._local_hostname = named.get("local_hostname") or None
        metadata_server = named.get("metadata_server")
        if isinstance(metadata_server, str) and metadata_server.startswith("etcd://"):
            return super().setup(metadata_server, **options)
        addresses = _node_addresses(named.get("master_server_address"))
        if addresses is None:
            return INVALID_PARAMS
        return super().setup(addresses, **options)

    def setup_dummy(self, mem_pool_size, local_buffer_size, server_address, **options):
        """SGLang's form: connects to the node at ``server_address``; the sizes are unused."""
        del mem_pool_size, local_buffer_size
        addresses = _node_addresses(server_address)
        if addresses is None:
            return INVALID_PARAMS
        return super().setup(addresses, **options)

    def get_hostname(self):
        """This client's host name: ``local_hostname`` as given to ``setup``, else the machine's."""
        return self._local_hostname or socket.gethostname()

    def health_check(self):
        """0 if the node answers, else a negative code."""
        answer = self.is_exist(b"\0strata-health-check")
        return OK if answer >= 0 else answer

    def batch_get_replica_desc(self, keys):
        """Where each key is: ``{key: [ReplicaDescriptor, ...]}``, one descriptor per tier that holds it on
        the node (an empty list for a key not stored, or one that could not be looked up)."""
        keys = list(keys)
        node = self.node_address() or ""
        located = self.batch_locate(keys)
        descriptors = {}
        for key, where in zip(keys, located):
            replicas = []
            if isinstance(where, tuple):
                size, in_dram, on_nvme = where
                if in_dram:
                    replicas.append(ReplicaDescriptor(node, "dram", size))
                if on_nvme:
                    replicas.append(ReplicaDescriptor(node, "nvme", size))
            descriptors[key] = replicas
        return descriptors

    def get_replica_desc(self, key):
        """``batch_get_replica_desc`` for one key: its list of descriptors."""
        return self.batch_get_replica_desc([key])[key]

    # ---- removal --------------------------------------------------------------------------------------

    def remove(self, key, force=False):
        """Removes ``key``; 0 or a negative code. ``force`` is accepted (nothing blocks a removal)."""
        del force
        return super().remove(key)

    def remove_by_regex(self, regex_pattern, force=False):
        """Removes every key the pattern matches; how many, or a negative code."""
        del force
        return super().remove_by_regex(regex_pattern)

    def remove_all(self, force=False):
        """Removes every key; how many, or a negative code."""
        del force
        return super().remove_all()

    def batch_remove(self, keys, force=False):
        """Removes each key; a code per key."""
        del force
        return super().batch_remove(list(keys))

    # ---- upserts and parts ----------------------------------------------------------------------------

    def put_parts(self, key, *parts, config=None):
        """Stores the concatenation of ``parts`` (bytes-like) as one value, sent part by part (no join)."""
        return self.batch_put_parts([key], [parts], config)[0]

    def upsert_parts(self, key, *parts, config=None):
        """``put_parts``, replacing a stored version."""
        return self.batch_put_parts([key], [parts], _upserting(config))[0]

    def upsert_batch(self, keys, values, config=None):
        """``put_batch``, replacing stored versions; one code for the call."""
        return self.put_batch(keys, values, _upserting(config))

    def upsert_from(self, key, buffer_ptr, size, config=None):
        """``put_from``, replacing a stored version."""
        return self.put_from(key, buffer_ptr, size, _upserting(config))

    def batch_upsert_from(self, keys, buffer_ptrs, sizes, config=None):
        """``batch_put_from``, replacing stored versions; a code per key."""
        return self.batch_put_from(keys, buffer_ptrs, sizes, _upserting(config))

    # ---- reads --------------------------------------------------------------------------------------

    def get_buffer(self, key):
        """The value of ``key`` as a ``BufferHandle``, or None if it cannot be read."""
        size = self.get_size(key)
        if size < 0:
            return None
        value = self.get(key)
        if len(value) != size:
            return None
        return BufferHandle(value)

    def batch_get_buffer(self, keys):
        """``get_buffer`` for many keys, in one round trip per shard; None for a key not read."""
        keys = list(keys)
        values = self.get_batch(keys)
        sizes = self.batch_is_exist(keys)
        return [BufferHandle(value) if value or exists == 1 else None for exists, value in zip(sizes, values)]

    def get_into_ranges(self, buffer_ptrs, all_keys, all_dst_offsets, all_src_offsets, all_sizes):
        """Mooncake's buffer-major ranged read: ``results[i][j][k]`` is the bytes read for fragment ``k``
        of key ``all_keys[i][j]`` into buffer ``i``, or a negative code. One ranged read per fragment."""
        if not len(buffer_ptrs) == len(all_keys) == len(all_dst_offsets) == len(all_src_offsets) == len(all_sizes):
            return [[[INVALID_PARAMS]] for _ in buffer_ptrs]
        results = []
        for pointer, keys, dst_offsets, src_offsets, sizes in zip(
            buffer_ptrs, all_keys, all_dst_offsets, all_src_offsets, all_sizes
        ):
            if not len(keys) == len(dst_offsets) == len(src_offsets) == len(sizes):
                results.append([[INVALID_PARAMS] for _ in keys])
                continue
            per_key = []
            for key, dsts, srcs, lens in zip(keys, dst_offsets, src_offsets, sizes):
                if not len(dsts) == len(srcs) == len(lens):
                    per_key.append([INVALID_PARAMS] * max(len(dsts), len(srcs), len(lens), 1))
                    continue
                per_key.append(
                    [self.get_range_into(key, src, pointer + dst, size) for dst, src, size in zip(dsts, srcs, lens)]
                )
            results.append(per_key)
        return results


def connect(address, missing, **options):
    """A ``StrataStore`` set up on ``address``, for the engine plugins: ``missing`` says which setting to give
    when ``address`` is empty (ValueError); ConnectionError when no node answers."""
    if not address:
        raise ValueError(f"strata: {missing} (the Strata node, host:port)")
    store = StrataStore()
    code = store.setup(address, **options)
    if code != OK:
        raise ConnectionError(f"strata: no node answered at {address!r} (code {code})")
    return store


def stored(code) -> bool:
    """Whether a put's code leaves the key holding the value: stored now, or already stored (blocks are
    immutable: their key names their content)."""
    return code in (OK, OBJECT_ALREADY_EXISTS)


def _upserting(config):
    """A copy of ``config`` (a ``ReplicateConfig`` or None) that replaces stored versions."""
    from . import ReplicateConfig

    upserting = ReplicateConfig()
    if config is not None:
        for name, value in vars(config).items():
            setattr(upserting, name, value)
    upserting.upsert = True
    return upserting
