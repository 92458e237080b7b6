"""Measuring code the commands call: the bench, the advisor, the GPU check."""
