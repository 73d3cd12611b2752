"""The test harness: what the fixtures in tests/conftest.py are made of.

  waiting      wait_for, wait_blocked, in_thread: conditions, not sleeps
  wire         RawClient, exchange, mbulk: exact bytes on a bare socket
  servers      ServerProcess, RedisServer, RedisModuleServer: servers on
               free ports (never 6379), each in a directory of its own;
               require() for the tools a test needs; fill() for a full disk
  cluster      ModuleCluster: a Redis Cluster of module servers
  streams      tw, tr, read_all, dataset, Reader ...: stream commands and
               views of a server's data
  spark        local_spark: a local SparkSession with rcp11 registered
  in_process   a ServerState and its Persistence, and a connection's reads,
               run in this process without a network

Test files import these names from conftest (which hands every one of them
on), as they always have; conftest keeps the fixtures and the options."""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
