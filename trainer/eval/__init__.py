"""Evaluation harness: benchmarks, generation, metrics, reports."""
