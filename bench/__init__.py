"""Benchmarks: each scenario starts the real server, drives it with wrk and compares with in-process torch."""
