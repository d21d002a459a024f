"""torch's ``torch.distributed.elastic.rendezvous.etcd_server``, at torch's path.

The implementation is a real adapter (it starts a process): see
:mod:`elastic.real.etcd_server`.  Importing this module costs no gRPC.
"""

from __future__ import annotations

from elastic.real.etcd_server import EtcdServer, find_free_port, stop_etcd

__all__ = ["EtcdServer", "find_free_port", "stop_etcd"]
