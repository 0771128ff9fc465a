"""Benchmarks that print ratios against a reference measured in the same run (`make bench`)."""
