"""A distributed session in the shape of TensorFlow's runtime: client, master, workers.

``messages`` (the protocol's requests and responses), ``channel`` (objects over a
communicator), ``rendezvous`` (where Send meets Recv), ``executor`` (the graph executor's
Send/Recv connected to a step's rendezvous; a step's partitions run in threads),
``cluster`` (which rank runs which task), ``worker`` (RegisterGraph / RunGraph, and the
worker-to-worker exchange of cut-edge tensors),
``master`` (MasterSession: prune, place, partition, cache, dispatch), ``session`` (the
client's ``DistributedSession`` and ``run_cluster``).
"""
from .channel import Channel, recv_obj, send_obj
from .cluster import MASTER_RANK, ClusterSpec
from .executor import connect, run_partitions
from .master import Master, MasterSession, SessionError, StepError
from .rendezvous import Rendezvous, RendezvousError, RendezvousTimeout
from .session import DistributedSession, run_cluster, serve_rank
from .mailbox import Mailbox
from .worker import StepRendezvous, Worker

__all__ = [n for n in dir() if not n.startswith("_")]
