"""Benchmark workloads behind ``mlcache bench NAME``. Never imported by the data path."""
