"""Parameter servers: sharded sparse tables, the temporary embedding matrix, server-side
optimisers, servers and clients on a ``Communicator``, and consistency models."""
from .client import PSClient, PSError, RemoteTable
from .cluster import ClusterSpec, Consistency, DenseVariable, ModelSpec, SparseVariable, SubCommunicator
from .embedding import (TemporaryEmbedding, dedupe, embedding_lookup, embedding_lookup_grad,
                        sparse_table_pull, sparse_table_push)
from .hashing import as_ids, group_by_shard, load_imbalance, shard_of, splitmix64, uniform_from_ids
from .optimizers import FTRL, OPTIMIZERS, SGD, Adagrad, Adam, Optimizer
from .server import ParameterServer
from .sparse_table import ShardedSparseTable, SparseTable

__all__ = [
    "PSClient", "PSError", "RemoteTable", "ClusterSpec", "Consistency", "DenseVariable", "ModelSpec",
    "SparseVariable", "SubCommunicator", "TemporaryEmbedding", "dedupe", "embedding_lookup",
    "embedding_lookup_grad", "sparse_table_pull", "sparse_table_push", "as_ids", "group_by_shard",
    "load_imbalance", "shard_of", "splitmix64", "uniform_from_ids", "FTRL", "OPTIMIZERS", "SGD",
    "Adagrad", "Adam", "Optimizer", "ParameterServer", "ShardedSparseTable", "SparseTable",
]
